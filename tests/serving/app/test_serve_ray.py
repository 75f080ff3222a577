"""The served system on a real local Ray: session pinning across replicas, a dead retrieval
actor, and the real default model through the ``openai`` client, streaming and not, with the
same output as plain decoding in process."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from ray import serve
from serve_fakes import fixed, scripted_factory

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app
from deployments.http.tool_stream import ToolCallStream
from toolspec.calls.output import OutputParse
from toolspec.library.keys import shard_of

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def post(base: str, session: str | None = None, tenant: str | None = None,
         **fields: Any) -> httpx.Response:
    headers = {"x-session-id": session} if session else {}
    if tenant is not None:
        headers["x-toolspec-tenant"] = tenant
    payload = {"model": "qwen2.5-coder-0.5b", "tools": [WEATHER],
               "messages": [{"role": "user", "content": "Weather in Oslo?"}], **fields}
    return httpx.post(f"{base}/v1/chat/completions", json=payload, headers=headers, timeout=60)


def chat(base: str, session: str | None = None, **fields: Any) -> dict[str, Any]:
    response = post(base, session, **fields)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def scripted_app(ray_serve: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    config = AppConfig(
        model=ModelConfig(replicas=2, num_cpus=0),
        library=LibraryConfig(path=str(tmp_path_factory.mktemp("library")), num_cpus=0),
        expose_replica=True)
    serve.run(build_app(config, scripted_factory(fixed(CALL[:20], CALL[20:]))),
              name="scripted", route_prefix="/scripted")
    yield f"{ray_serve}/scripted"
    serve.delete("scripted")


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                             "parameters": WEATHER["function"]["parameters"]}}


def test_requests_go_where_their_session_or_prompt_is_cached(scripted_app: str) -> None:
    """Prefix-aware routing across two replicas: a session stays on its replica whatever it
    asks; a prompt goes where the same prompt went; prompts that share nothing spread."""
    turns = {chat(scripted_app, "session-a",
                  messages=[{"role": "user", "content": f"Question number {i}?"}]
                  )["toolspec"]["replica"] for i in range(5)}
    assert len(turns) == 1
    same = {chat(scripted_app, f"other-{i}")["toolspec"]["replica"] for i in range(5)}
    assert len(same) == 1  # the same tools and question, from five sessions
    spread = {chat(scripted_app, None, tools=[tool(f"tool_number_{i}_of_many")],
                   messages=[{"role": "user", "content": f"Use tool {i} on item {i * 7}."}]
                   )["toolspec"]["replica"] for i in range(16)}
    assert len(spread) == 2
    by_user = {chat(scripted_app, None, user="bob",
                    messages=[{"role": "user", "content": f"Hi {i}"}])["toolspec"]["replica"]
               for i in range(4)}
    assert len(by_user) == 1  # no session header: the body's user is the session


def test_the_tenant_header_reaches_the_shared_library(scripted_app: str) -> None:
    library = serve.get_deployment_handle("CallLibraryService", app_name="scripted")
    assert post(scripted_app, "tenant-1", tenant="acme").status_code == 200
    deadline = time.monotonic() + 120
    while not (stored := library.top_calls.remote("acme", ["get_weather"], 4).result()):
        assert time.monotonic() < deadline, "acme's call never reached the library"
        time.sleep(0.5)  # the replica sends finished calls in the background
    assert [(r.tenant, r.arguments) for r in stored] == [("acme", {"city": "Oslo"})]
    assert library.top_calls.remote("globex", ["get_weather"], 4).result() == []
    refused = post(scripted_app, tenant="not a tenant")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_tenant"


METRICS = ("toolspec_requests", "toolspec_admission_refusals",
           "toolspec_time_to_first_token_seconds", "toolspec_inter_token_latency_seconds",
           "toolspec_tokens_per_step", "toolspec_accepted_draft_tokens", "toolspec_draft_seconds",
           "toolspec_verify_seconds", "toolspec_batch_size", "toolspec_active_requests",
           "toolspec_prompt_tokens", "toolspec_library_lookups", "toolspec_routing_decisions",
           "toolspec_routed_prefix_blocks",
           "toolspec_library_lookup_seconds")


def test_health_models_and_metrics_of_a_real_deployment(scripted_app: str) -> None:
    """/health reports each deployment as Serve sees it; /v1/models what the replicas
    loaded; the application metrics reach the node's Prometheus endpoint (Ray's exporter)."""
    health = httpx.get(f"{scripted_app}/health", timeout=60)
    assert health.status_code == 200, health.text
    report = health.json()
    assert report["status"] == "ok" and report["library"] == "reachable"
    assert report["deployments"]["ModelServer"]["replicas"] == {"RUNNING": 2}
    assert report["model"]["model"] == "toy-model"
    listed = httpx.get(f"{scripted_app}/v1/models", timeout=60).json()["data"]
    assert listed[0]["root"] == "toy-model" and listed[0]["max_model_len"] == 4096
    chat(scripted_app, "metrics-1")
    # Without tools the scripted answer is text in two fragments: a first token, then a gap.
    with httpx.stream("POST", f"{scripted_app}/v1/chat/completions", timeout=60, json={
            "model": "qwen2.5-coder-0.5b", "stream": True,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]}) as streamed:
        assert streamed.status_code == 200 and "[DONE]" in streamed.read().decode()
    assert post(scripted_app, tenant="not a tenant").status_code == 400
    metrics_url = f"http://127.0.0.1:{ray.nodes()[0]['MetricsExportPort']}/metrics"
    deadline, missing = time.monotonic() + 120, set(METRICS)
    while missing:  # workers push their metrics to the node's agent every few seconds
        assert time.monotonic() < deadline, f"never exported: {sorted(missing)}"
        time.sleep(2)
        try:
            text = httpx.get(metrics_url, timeout=10).text
        except httpx.HTTPError:
            continue
        missing = {name for name in missing if f"ray_{name}" not in text}
    assert 'status="400"' in text and 'reason="invalid_tenant"' in text


def test_requests_succeed_with_the_retrieval_actor_dead(scripted_app: str) -> None:
    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if "CallLibraryService" in a["name"] and "scripted" in a["name"]]
    assert names, "the retrieval actor is not running"
    for actor in names:
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    for i in range(3):
        body = chat(scripted_app, f"after-kill-{i}")
        call = body["choices"][0]["message"]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}


def test_a_library_served_by_two_actors_keeps_each_call_with_its_owner(
        ray_serve: str, tmp_path: Path) -> None:
    config = AppConfig(model=ModelConfig(num_cpus=0),
                       library=LibraryConfig(path=str(tmp_path / "library"), num_cpus=0,
                                             actors=2))
    serve.run(build_app(config, scripted_factory(fixed(CALL[:20], CALL[20:]))),
              name="parts", route_prefix="/parts")
    try:
        base = f"{ray_serve}/parts"
        assert post(base, "s-1", tenant="acme").status_code == 200
        owner = shard_of("acme", "get_weather", 8) % 2
        handles = [serve.get_deployment_handle(f"CallLibraryService-{i}", app_name="parts")
                   for i in range(2)]
        deadline = time.monotonic() + 120
        while not handles[owner].top_calls.remote("acme", ["get_weather"], 4).result():
            assert time.monotonic() < deadline, "the call never reached its owner"
            time.sleep(0.5)
        assert handles[1 - owner].stats.remote().result()["calls"] == 0
        health = httpx.get(f"{base}/health", timeout=60).json()
        assert health["library"] == "reachable"
        assert {"CallLibraryService-0", "CallLibraryService-1"} <= set(health["deployments"])
    finally:
        serve.delete("parts")


@pytest.mark.real_model
def test_openai_client_gets_plain_decodings_calls_from_the_default_model(
        ray_serve: str, tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    from toolspec import Engine, GenerationParams, TargetModel
    from toolspec.bench.datasets import load_apibank, sample_path
    from toolspec.calls.prompts import chat_prompt
    from toolspec.calls.tools import ToolSet
    from toolspec.model.loading import load_model

    # An API-Bank dialogue as an OpenAI client sends it: the tools in ``tools`` (the chat
    # template lists them), not in API-Bank's own system prompt. The item with the shortest
    # prompt and call keeps the test to three short generations.
    item = load_apibank(sample_path(), limit=2)[1]
    tools = [tool.openai() for tool in item.tools]
    messages = [dict(m) for m in item.messages if m["role"] != "system"]
    config = AppConfig(model=ModelConfig(model="qwen2.5-coder-0.5b", dtype="float32",
                                         draft_budget=7, num_cpus=1),
                       library=LibraryConfig(path=str(tmp_path / "library"), num_cpus=0),
                       default_max_tokens=64)
    serve.run(build_app(config), name="real", route_prefix="/real")
    try:
        client = openai.OpenAI(base_url=f"{ray_serve}/real/v1", api_key="unused", timeout=300)
        plain = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=messages,
                                               tools=tools)
        chunks = list(client.chat.completions.create(
            model="qwen2.5-coder-0.5b", messages=messages, tools=tools, stream=True))
    finally:
        serve.delete("real")

    loaded = load_model("qwen2.5-coder-0.5b", "float32")  # AR on the replica's kernels
    prompt, call_format = chat_prompt(loaded.tokenizer, messages,
                                      [t.openai() for t in ToolSet.from_openai(tools)])
    reference = Engine(TargetModel(loaded.model), loaded.tokenizer).generate(
        prompt, None, GenerationParams(max_new_tokens=64))
    parse = OutputParse(call_format)  # the replica's one parse, of the reference output
    parse.feed(reference.text)
    expected = ToolCallStream(call_format, "ref")
    expected.feed(reference.text, parse.spans)
    expected.finish()
    assert expected.tool_calls, f"the model made no call: {reference.text!r}"
    want = [(c.name, c.arguments) for c in expected.tool_calls]
    assert want[0][0] == item.reference_calls[0]["name"]

    message = plain.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == want
    assert message.content == expected.content
    assert plain.choices[0].finish_reason == "tool_calls"
    assert plain.usage.completion_tokens == len(reference.tokens)
    assert plain.model_extra["toolspec"]["steps"] < len(reference.tokens) - 1  # drafts accepted

    streamed: dict[int, list[str]] = {}
    content = ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for fragment in delta.tool_calls or []:
            if fragment.index not in streamed:
                assert fragment.function.name and fragment.id
                streamed[fragment.index] = [fragment.function.name, ""]
            streamed[fragment.index][1] += fragment.function.arguments or ""
    assert [tuple(streamed[i]) for i in sorted(streamed)] == want
    assert content == (expected.content or "")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
