"""Agent loops run by the frameworks themselves against the served default model on a real local
Ray Serve, on the shipped engine (vLLM's, drafting with the ToolSpec proposer): the OpenAI
Agents SDK (on the Responses API and on its chat-completions model class) and LangGraph's
prebuilt ReAct agent over LangChain's ``ChatOpenAI``, each streamed and not, each a real
multi-turn tool loop with a local Python tool, bounded by the framework's own turn limit.

The frameworks run in their own venv (``make agents-venv``; ``make test`` builds it) through
``load_tests/agent_loops.py``, as a user's agent process would. What is asserted is the
server's part: every turn parses in the framework, the tool ran with the arguments the model
wrote (the tool's schema), call ids round-trip into the results sent back, streamed and not
agree, and later turns of a session reuse the cached prompt. Whether the model then answers
is the model's part (docs/serving.md, "Agent frameworks": the registered models keep calling).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import jsonschema
import pytest
from helpers import REPO
from ray import serve

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app
from deployments.app.builder import ResponsesConfig

AGENTS_PYTHON = REPO / ".venv-agents" / "bin" / "python"
MODEL = "qwen2.5-coder-0.5b"
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"], "additionalProperties": False}
MAX_TURNS = 3

pytestmark = [pytest.mark.real_model, pytest.mark.ray, pytest.mark.vllm]


@pytest.fixture(scope="module")
def agent_app(ray_serve: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    if not AGENTS_PYTHON.exists():
        pytest.fail(f"{AGENTS_PYTHON} is missing: `make agents-venv` builds it (`make test` "
                    "does so first)")
    # vLLM's engine with the ToolSpec proposer, as serve_config.yaml ships it (fp32: the
    # same answers streamed or not; eager: a faster start).
    config = AppConfig(model=ModelConfig(model=MODEL, dtype="float32", engine="vllm",
                                         kv_cache_gib=1.0, compile=False, num_cpus=1,
                                         max_ongoing_requests=4),
                       library=LibraryConfig(path=str(tmp_path_factory.mktemp("lib")),
                                             num_cpus=0),
                       responses=ResponsesConfig(path=str(tmp_path_factory.mktemp("resp"))))
    serve.run(build_app(config), name="agents", route_prefix="/agents")
    yield f"{ray_serve}/agents"
    serve.delete("agents")


def run_loop(base: str, framework: str, api: str, stream: bool) -> dict[str, Any]:
    session = f"{framework}-{api}-{'stream' if stream else 'plain'}"
    command = [str(AGENTS_PYTHON), str(REPO / "load_tests" / "agent_loops.py"),
               "--base-url", base, "--model", MODEL, "--framework", framework, "--api", api,
               "--session", session, "--max-turns", str(MAX_TURNS), "--max-tokens", "128",
               *(["--stream"] if stream else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("framework", "api"), [("openai-agents", "responses"),
                                                ("openai-agents", "chat"),
                                                ("langgraph", "chat")])
def test_a_framework_runs_a_tool_loop_whose_every_turn_parses(agent_app: str, framework: str,
                                                              api: str) -> None:
    runs = [run_loop(agent_app, framework, api, stream) for stream in (False, True)]
    for run in runs:
        calls = run["tool_calls"]
        assert calls, run  # the model called the tool, and the framework read the call
        assert not run.get("invalid_tool_calls"), run
        for call in calls:
            assert call["name"] == "get_weather"
            jsonschema.validate(json.loads(call["arguments"]), CITY_SCHEMA)
        # The tool ran once per call, on the arguments the framework parsed from ours.
        assert [{"city": json.loads(c["arguments"])["city"]} for c in calls] == run["tool_runs"]
        # Every result went back under the id of the call it answers.
        assert [o["call_id"] for o in run["tool_outputs"]] == [c["call_id"] for c in calls]
        assert len({c["call_id"] for c in calls}) == len(calls)
        # Bounded by the framework: it answered, or its own turn limit ended the loop.
        assert run["final_output"] is not None or run["max_turns_exceeded"], run
        # A session's later turns start with the earlier ones: the prompt comes from the cache.
        usage = run["usage"]
        assert len(usage) >= 2 and all(turn["cached_tokens"] >= 32 for turn in usage[1:]), usage
    plain, streamed = runs
    assert [(c["name"], c["arguments"]) for c in plain["tool_calls"]] == \
        [(c["name"], c["arguments"]) for c in streamed["tool_calls"]]
    assert plain["final_output"] == streamed["final_output"]
