"""Stored responses on a real local Ray with two ingress replicas (a scripted engine): one
actor owns the store and every ingress replica reaches it — a response stored through one is
read, continued and deleted through any — and no ingress process opens the store's file (on
two nodes, a file per ingress node would be a store per node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from ray import serve
from serve_fakes import fixed, scripted_factory

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app
from deployments.app.builder import ResponsesConfig
from deployments.ops.names import RESPONSES_DEPLOYMENT

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
READS = 24  # through the proxy, which spreads them over both ingress replicas


@pytest.fixture(scope="module")
def two_ingresses(ray_serve: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[str, Path]:
    store = tmp_path_factory.mktemp("responses")
    config = AppConfig(model=ModelConfig(num_cpus=0), library=LibraryConfig(enabled=False),
                       ingress_replicas=2, count_prompt_tokens_at_ingress=False,
                       responses=ResponsesConfig(path=str(store), num_cpus=0))
    serve.run(build_app(config, scripted_factory(fixed(CALL[:20], CALL[20:]))),
              name="stored", route_prefix="/stored")
    yield f"{ray_serve}/stored", store
    serve.delete("stored")


def create(base: str, **fields: Any) -> httpx.Response:
    body = {"model": "qwen2.5-coder-0.5b", "input": "Weather in Oslo?", "tools": [WEATHER],
            **fields}
    return httpx.post(f"{base}/v1/responses", json=body, headers={"x-toolspec-tenant": "acme"},
                      timeout=60)


def read(base: str, response_id: str, method: str = "GET") -> httpx.Response:
    return httpx.request(method, f"{base}/v1/responses/{response_id}",
                         headers={"x-toolspec-tenant": "acme"}, timeout=60)


def processes_mapping(directory: Path) -> set[int]:
    """The processes that have the LMDB environment in ``directory`` open (mapped)."""
    found = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if str(directory / "data.mdb") in maps.read_text():
                found.add(int(maps.parent.name))
        except OSError:  # a process that ended meanwhile, or another user's
            continue
    return found


def test_every_ingress_replica_reaches_the_one_store(two_ingresses: tuple[str, Path]) -> None:
    base, directory = two_ingresses
    deployments = serve.status().applications["stored"].deployments
    assert deployments["Ingress"].replica_states.get("RUNNING") == 2
    assert deployments[RESPONSES_DEPLOYMENT].replica_states.get("RUNNING") == 1
    first = create(base)
    assert first.status_code == 200, first.text
    stored = first.json()
    assert all(read(base, stored["id"]).json() == stored for _ in range(READS))
    turns = [create(base, previous_response_id=stored["id"],
                    input=[{"type": "function_call_output",
                            "call_id": stored["output"][0]["call_id"], "output": "sunny"}])
             for _ in range(READS // 2)]
    assert all(turn.status_code == 200 for turn in turns), [t.text for t in turns]
    assert all(turn.json()["previous_response_id"] == stored["id"] for turn in turns)
    assert read(base, stored["id"], "DELETE").json()["deleted"] is True
    assert all(read(base, stored["id"]).status_code == 404 for _ in range(READS))
    # One process holds the store's file: its actor. The ingress replicas only call it.
    assert len(processes_mapping(directory)) == 1
