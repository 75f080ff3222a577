"""The deployment as users run it: ``ray start --head`` and ``serve deploy serve_config.yaml``
(the real root config, its shipped engine included; only its HTTP port and library directory
are moved into the test's own space, and vLLM's graph compile is left out: ``deploy_config``),
ready per ``deployments.ops.ready``, a tool call whole and streamed and through the Responses
API with the ``openai`` client, then ``serve shutdown`` and the head stopped.

The Ray head is this test's own (``load_tests/local_ray.py``): its own temp dir and ports, and
every process it started stopped after — never ``ray stop``, which would stop any Ray on the
machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import psutil
import pytest
import yaml
from helpers import REPO

from deployments.ops.ready import wait_ready

sys.path.insert(0, str(REPO / "load_tests"))
from local_ray import cli, free_port, ray_head  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
READY_TIMEOUT_S = 900  # the model replica loads (and, on first use, converts) the weights


def deploy_config(tmp_path: Path, http_port: int) -> Path:
    """``serve_config.yaml`` as shipped, but on ``http_port``, with a fresh library and vLLM's
    graph not compiled: on a fresh machine the compile alone takes a minute of a 2-core CI
    run, and it is vLLM's own default path, outside the graph of what this project adds (the
    proposer and the serving path run the same compiled or not)."""
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config["http_options"]["port"] = http_port
    (application,) = config["applications"]
    application["args"]["library"]["path"] = str(tmp_path / "library")
    application["args"]["model"]["compile"] = False
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.real_model
def test_serve_deploy_of_the_root_config_answers_a_tool_call(tmp_path: Path) -> None:
    http_port = free_port()
    config = deploy_config(tmp_path, http_port)
    url = f"http://127.0.0.1:{http_port}"
    with ray_head(tmp_path) as head:
        serve = [cli("serve")]
        subprocess.run([*serve, "deploy", "--address", head.dashboard, str(config)],
                       env=head.env, check=True, timeout=120)
        try:
            assert wait_ready(url, MODEL, READY_TIMEOUT_S), "the deployment never answered"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
            reply = client.chat.completions.create(
                model=MODEL, tools=[WEATHER], max_tokens=64,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                extra_headers={"x-session-id": "deploy-1", "x-toolspec-tenant": "deploy-test"})
            streamed = list(client.chat.completions.create(
                model=MODEL, tools=[WEATHER], max_tokens=64, stream=True,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                extra_headers={"x-session-id": "deploy-2", "x-toolspec-tenant": "deploy-test"}))
            response = client.responses.create(
                model=MODEL, input="What is the weather in Paris?", max_output_tokens=64,
                tools=[{"type": "function", **WEATHER["function"]}])
            described = client.models.list().data[0].model_extra
            model_niceness = {process.nice() for process in _model_replica_processes(head.pid)}
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "hi"}],
                    extra_headers={"x-toolspec-tenant": "not a tenant"})
            assert refused.value.code == "invalid_tenant"
        finally:
            subprocess.run([*serve, "shutdown", "--address", head.dashboard, "--yes"],
                           env=head.env, check=False, timeout=120)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    assert reply.model_extra["toolspec"]["steps"] >= 1
    # The shipped engine: vLLM's, drafting with the ToolSpec proposer.
    assert described["engine"] == "vllm"
    # The model's replica and vLLM's processes at normal priority, not Ray's nice 15.
    assert model_niceness == {0}, model_niceness
    fragments = [c.function for chunk in streamed for choice in chunk.choices
                 for c in choice.delta.tool_calls or ()]
    assert fragments[0].name == "get_weather"
    assert json.loads("".join(f.arguments or "" for f in fragments)) == \
        json.loads(call.function.arguments)  # streamed as answered whole
    (item,) = [item for item in response.output if item.type == "function_call"]
    assert item.name == "get_weather" and "paris" in json.loads(item.arguments)["city"].lower()


def _model_replica_processes(head_pid: int) -> list[psutil.Process]:
    """The head's ModelServer replica process and every process it started (vLLM's
    engine); another Ray on the machine is not looked at."""
    found = []
    for process in psutil.Process(head_pid).children(recursive=True):
        try:
            if "ServeReplica:toolspec:ModelServer" in " ".join(process.cmdline()):
                found += [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:  # a short-lived helper that ended meanwhile
            continue
    return found
