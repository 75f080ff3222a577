"""Conformance of the served system with what OpenAI clients rely on, over real HTTP on a real
local Ray Serve: the default model under ``tool_choice`` auto / required / named (the
``openai`` client and LangChain's ``ChatOpenAI.bind_tools``), ``response_format``, 400s with
``param`` for every bad request (limits included, refused before any model work), and — on a
scripted engine whose pace the test sets — 429 with Retry-After when the queue is full, 504 past
the deadline, a client that disconnects freeing its slot, a failure answered without exception
text, one tool-call fragment per chunk, and the replica id hidden."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from ray import serve
from serve_fakes import by_message, failing_factory

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app
from deployments.app.builder import ResponsesConfig
from deployments.http.limits import AdmissionLimits

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                          "parameters": {"type": "object", "properties": {}}}}
ASK_WEATHER = ("The weather in San Francisco. The weather in San Francisco. What is the weather "
               "in San Francisco? Use the get_weather tool for San Francisco.")
ASK_TIME = "What time is it? Use the get_time tool."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TWO_CALLS = CALL + "\n" + CALL.replace("Oslo", "Rome")


@pytest.fixture(scope="module")
def real_app(ray_serve: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The default model as ``serve_config.yaml`` deploys it (fp32: exact, on any CPU)."""
    config = AppConfig(model=ModelConfig(model=MODEL, dtype="float32", draft_budget=8,
                                         num_cpus=1, max_ongoing_requests=4),
                       library=LibraryConfig(path=str(tmp_path_factory.mktemp("lib")),
                                             num_cpus=0),
                       responses=ResponsesConfig(path=str(tmp_path_factory.mktemp("resp"))),
                       default_max_tokens=128)
    serve.run(build_app(config), name="conform", route_prefix="/conform")
    yield f"{ray_serve}/conform"
    serve.delete("conform")


def scripted_app(ray_serve: str, name: str, timeout_s: float) -> str:
    """One request at a time, one more queued; 20 steps a second. A message holding "long"
    runs 600 steps, "medium" 20, "two" finishes a call and starts the next in one step,
    "boom" fails in its second step."""
    script = by_message({"long": ["x"] * 600, "medium": ["y"] * 20,
                         "two": [TWO_CALLS[:30], TWO_CALLS[30:130], TWO_CALLS[130:]]},
                        default=[CALL[:12], CALL[12:]])
    config = AppConfig(model=ModelConfig(num_cpus=0, max_ongoing_requests=1,
                                         max_queued_requests=1, retry_after_s=3),
                       library=LibraryConfig(enabled=False), request_timeout_s=timeout_s,
                       count_prompt_tokens_at_ingress=False)
    serve.run(build_app(config, failing_factory(script, step_s=0.05)), name=name,
              route_prefix=f"/{name}")
    return f"{ray_serve}/{name}"


@pytest.fixture(scope="module")
def paced_app(ray_serve: str) -> str:
    yield scripted_app(ray_serve, "paced", timeout_s=60)
    serve.delete("paced")


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=300, max_retries=0)


def post(base: str, payload: Any, **headers: str) -> httpx.Response:
    content = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    return httpx.post(f"{base}/v1/chat/completions", content=content, timeout=300,
                      headers={"content-type": "application/json", **headers})


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def error_of(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()["error"]


# ---- tool_choice on the default model ---------------------------------------------------

@pytest.mark.real_model
@pytest.mark.parametrize("tool, text", [(WEATHER, ASK_WEATHER), (CLOCK, ASK_TIME)])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_one_well_formed_call_for_every_tool_choice(real_app: str, tool: dict[str, Any],
                                                    text: str, choice: str) -> None:
    name = tool["function"]["name"]
    tool_choice = {"type": "function", "function": {"name": name}} if choice == "named" \
        else choice
    reply = client(real_app).chat.completions.create(
        model=MODEL, messages=user(text), tools=[tool], tool_choice=tool_choice, max_tokens=128,
        temperature=0)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls", reply
    assert [call.function.name for call in calls] == [name]
    arguments = json.loads(calls[0].function.arguments)
    if choice != "auto":  # the grammar holds the arguments to the schema
        jsonschema.validate(arguments, tool["function"]["parameters"])
    assert reply.usage.completion_tokens < 40
    assert "replica" not in reply.model_extra["toolspec"]


@pytest.mark.real_model
def test_streamed_forced_call_equals_the_plain_one(real_app: str) -> None:
    fields = {"model": MODEL, "messages": user(ASK_WEATHER), "tools": [WEATHER],
              "tool_choice": "required", "max_tokens": 128}
    plain = client(real_app).chat.completions.create(**fields)
    name, arguments, finish = None, "", None
    for chunk in client(real_app).chat.completions.create(**fields, stream=True):
        if not chunk.choices:
            continue
        fragments = chunk.choices[0].delta.tool_calls or []
        assert len(fragments) <= 1
        for fragment in fragments:
            name = name or fragment.function.name
            arguments += fragment.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    call = plain.choices[0].message.tool_calls[0]
    assert (name, arguments, finish) == (call.function.name, call.function.arguments,
                                         "tool_calls")


@pytest.mark.real_model
@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_langchain_bind_tools_gets_one_call_invoked_and_streamed(real_app: str,
                                                                 choice: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=f"{real_app}/v1", api_key="unused",
                      temperature=0, max_tokens=128, max_retries=0, timeout=300)
    bound = chat.bind_tools([WEATHER], tool_choice=None if choice == "auto" else choice)
    invoked = bound.invoke(ASK_WEATHER)
    assert not invoked.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in invoked.tool_calls] \
        == [("get_weather", {"city": "San Francisco"})]
    streamed = None
    for chunk in bound.stream(ASK_WEATHER):
        streamed = chunk if streamed is None else streamed + chunk
    assert not streamed.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] \
        == [(c["name"], c["args"]) for c in invoked.tool_calls]


@pytest.mark.real_model
def test_response_format_json_schema_is_enforced(real_app: str) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "temperature_c": {"type": "number"}},
              "required": ["city", "temperature_c"]}
    reply = client(real_app).chat.completions.create(
        model=MODEL, max_tokens=80, messages=user("The weather in Oslo, as JSON."),
        response_format={"type": "json_schema", "json_schema": {
            "name": "weather", "strict": True, "schema": schema}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


@pytest.mark.real_model
def test_a_sessions_second_turn_reports_its_cached_prompt_tokens(real_app: str) -> None:
    turn = [{"role": "user", "content": "Weather in Paris?"}]
    headers = {"x-session-id": "conformance-1", "x-toolspec-tenant": "cache-probe"}
    first = post(real_app, {"model": MODEL, "messages": turn, "tools": [WEATHER]},
                 **headers).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    answer = first["choices"][0]["message"]
    history = [*turn, {k: v for k, v in answer.items() if v is not None},
               {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"],
                "content": '{"celsius": 21}'}]
    second = post(real_app, {"model": MODEL, "messages": history, "tools": [WEATHER]},
                  **headers).json()
    # The first turn's whole blocks (the prompt the second one starts with).
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == first["usage"]["prompt_tokens"] // 32 * 32 > 0


# ---- bad requests: 400 with param, before any model work --------------------------------

@pytest.mark.real_model
@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"messages": None}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"temperature": -3}, "temperature"),
    ({"tools": [{"type": "function", "function": {"name": "a b/c"}}]},
     "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]},
     "messages[1].tool_call_id"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": []}, "tools"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(1000)],
      "max_tokens": 4}, "tools"),
])
def test_bad_requests_are_400_with_param(real_app: str, fields: dict[str, Any],
                                         param: str) -> None:
    payload = {"model": MODEL, "messages": user("hi"), **fields}
    if payload["messages"] is None:
        del payload["messages"]
    error = error_of(post(real_app, payload))
    assert error["param"] == param and error["type"] == "invalid_request_error"


# ---- the Responses API on the default model ---------------------------------------------

WEATHER_TOOL = {"type": "function", **WEATHER["function"]}  # the Responses shape


@pytest.mark.real_model
def test_responses_function_call_plain_and_streamed_agree(real_app: str) -> None:
    fields = {"model": MODEL, "input": ASK_WEATHER, "tools": [WEATHER_TOOL],
              "tool_choice": "required", "max_output_tokens": 128}
    plain = client(real_app).responses.create(**fields)
    [call] = [item for item in plain.output if item.type == "function_call"]
    assert call.name == "get_weather" and plain.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    events = list(client(real_app).responses.create(**fields, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert [event.arguments for event in done] == [call.arguments]
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens


@pytest.mark.real_model
def test_responses_next_turn_from_previous_response_id_reuses_the_cached_prompt(
        real_app: str) -> None:
    headers = {"x-toolspec-tenant": "responses-probe"}
    first = client(real_app).responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required",
        max_output_tokens=64, extra_headers=headers)
    call = next(item for item in first.output if item.type == "function_call")
    second = client(real_app).responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER_TOOL],
        max_output_tokens=32, extra_headers=headers,  # the same tools: the same prompt prefix
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": '{"celsius": 21}'}])
    assert second.previous_response_id == first.id and second.status in ("completed",
                                                                          "incomplete")
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= \
        first.usage.input_tokens // 32 * 32 > 0
    other = httpx.get(f"{real_app}/v1/responses/{first.id}", headers={
        "x-toolspec-tenant": "someone-else"}, timeout=30)
    assert other.status_code == 404


@pytest.mark.real_model
@pytest.mark.parametrize("fields, param", [
    ({"input": [{"type": "reasoning"}]}, "input[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
])
def test_bad_responses_requests_are_400_with_param(real_app: str, fields: dict[str, Any],
                                                   param: str) -> None:
    payload = {"model": MODEL, "input": "hi", **fields}
    response = httpx.post(f"{real_app}/v1/responses", json=payload, timeout=60)
    error = error_of(response)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.real_model
def test_the_openai_client_raises_bad_request_error(real_app: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client(real_app).chat.completions.create(model=MODEL, messages=user("hi"),
                                                 tool_choice="required")
    assert raised.value.body["param"] == "tool_choice"


@pytest.mark.real_model
def test_a_call_without_arguments_in_history_is_accepted(real_app: str) -> None:
    history = [{"role": "user", "content": ASK_TIME},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_time", "arguments": ""}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "10:42"}]
    response = post(real_app, {"model": MODEL, "messages": history, "tools": [CLOCK],
                               "max_tokens": 8})
    assert response.status_code == 200, response.text


@pytest.mark.real_model
def test_oversized_nested_and_broken_text_are_400s_and_the_replica_serves_on(
        real_app: str) -> None:
    started = time.monotonic()
    huge = error_of(post(real_app, {"model": MODEL, "max_tokens": 4,
                                    "messages": user("word " * 600_000)}))  # 3 MB
    assert huge["code"] == "context_length_exceeded" and "32768" in huge["message"]
    nested = '{{"model": "{}", "messages": {}}}'.format(MODEL, "[" * 5000 + "]" * 5000)
    assert error_of(post(real_app, nested))["code"] == "nested_too_deep"
    surrogate = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "\\udcff"}}]}}'
    broken = error_of(post(real_app, surrogate))
    assert broken["param"] == "messages[0].content" and broken["code"] == "invalid_text"
    over = error_of(post(real_app, b'{"pad": "' + b"x" * (5 << 20) + b'"}'))
    assert over["code"] == "request_too_large"
    assert time.monotonic() - started < 60  # refused at the door: no prefill of 600k tokens
    fine = post(real_app, {"model": MODEL, "messages": user("Say hi."), "max_tokens": 4})
    assert fine.status_code == 200


# ---- queueing, deadlines, disconnects and failures (scripted pace) ----------------------

def test_a_full_queue_answers_429_with_retry_after(paced_app: str) -> None:
    payload = {"model": MODEL, "messages": user("medium")}
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(post(paced_app, payload)))
               for _ in range(6)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    statuses = sorted(r.status_code for r in results)
    assert 200 in statuses and 429 in statuses, statuses
    busy = next(r for r in results if r.status_code == 429)
    assert busy.headers["retry-after"] == "3"
    assert busy.json()["error"]["type"] == "rate_limit_exceeded"


def test_a_client_that_disconnects_frees_its_slot(paced_app: str) -> None:
    with httpx.stream("POST", f"{paced_app}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "stream": True, "messages": user("long")}) as response:
        for line in response.iter_lines():
            if '"content"' in line and '"x"' in line:
                break  # decoding has begun: leave (30 s of steps remain)
    started = time.monotonic()
    after = post(paced_app, {"model": MODEL, "messages": user("next")})
    assert after.status_code == 200, after.text
    assert time.monotonic() - started < 15  # not after the abandoned request's 30 s


def test_a_failure_is_a_500_naming_only_a_request_id_and_the_replica_serves_on(
        paced_app: str) -> None:
    response = post(paced_app, {"model": MODEL, "messages": user("boom")})
    error = error_of(response, 500)
    assert "secret" not in response.text and "RuntimeError" not in response.text
    assert response.headers["x-request-id"] in error["message"]
    with httpx.stream("POST", f"{paced_app}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "stream": True, "messages": user("boom")}) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"internal_error"' in lines[-2]
    assert "secret" not in "".join(lines)
    assert post(paced_app, {"model": MODEL, "messages": user("hi")}).status_code == 200


def test_one_tool_call_fragment_per_chunk(paced_app: str) -> None:
    with httpx.stream("POST", f"{paced_app}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "stream": True, "tools": [WEATHER],
            "messages": user("two")}) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines()
                  if line.startswith("data: {")]
    fragments = [len(c["choices"][0]["delta"].get("tool_calls", ())) for c in chunks
                 if c["choices"]]
    # The middle step finishes the first call and starts the second: two chunks.
    assert max(fragments) == 1 and sum(fragments) >= 3


def test_past_the_deadline_the_answer_is_504_or_an_error_event(ray_serve: str) -> None:
    base = scripted_app(ray_serve, "deadline", timeout_s=2)
    try:
        error = error_of(post(base, {"model": MODEL, "messages": user("long")}), 504)
        assert error["code"] == "deadline_exceeded"
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=60, json={
                "model": MODEL, "stream": True, "messages": user("long")}) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"deadline_exceeded"' in lines[-2]
        assert post(base, {"model": MODEL, "messages": user("hi")}).status_code == 200
    finally:
        serve.delete("deadline")


def test_limits_are_settings(tmp_path: Path) -> None:
    config = AppConfig.model_validate({"limits": {"max_tools": 8, "max_body_bytes": 65536},
                                       "request_timeout_s": 30})
    policy = config.policy()
    assert (policy.limits.max_tools, policy.limits.max_body_bytes) == (8, 65536)
    assert policy.request_timeout_s == 30 and AdmissionLimits().max_tools == 128
