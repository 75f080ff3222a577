"""The deployment as users run it: ``ray start --head`` and ``serve deploy serve_config.yaml``
(the real root config; only its HTTP port and library directory are moved into the test's own
space), ready per ``deployments.ready``, one tool call through the ``openai`` client, then
``serve shutdown`` and the head stopped.

The Ray head is this test's own: its own temp dir and ports, started as ``ray start --block``,
whose SIGTERM stops every process it started — never ``ray stop``, which would stop any Ray on
the machine. Its workers import this checkout first (PYTHONPATH), whatever the venv holds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from deployments.ready import wait_ready

ROOT = Path(__file__).parent.parent
MODEL = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
START_TIMEOUT_S = 600
READY_TIMEOUT_S = 900  # the model replica loads (and, on first use, converts) the weights


@dataclass(frozen=True)
class RayHead:
    dashboard: str  # what `serve deploy --address` takes
    env: dict[str, str]  # the environment the Ray CLIs run with


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cli(name: str) -> str:
    """The Ray CLI of this Python's environment."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"the {name} command is not installed"
    return found


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies (Linux), so that an interrupted
    test run still stops the head it started."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _processes_under(temp_dir: Path) -> list[int]:
    """Ids of this machine's processes whose command line names ``temp_dir``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(temp_dir).encode() in command and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def _stop(head: subprocess.Popen, temp_dir: Path) -> None:
    """Stop a head and every process it started (those naming its temp dir); drop the dir."""
    head.terminate()  # `ray start --block` stops every process it started on SIGTERM
    try:
        head.wait(timeout=120)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    for pid in _processes_under(temp_dir):  # anything that outlived it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


def _start_head(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, Path, str]:
    """``ray start --head --block`` on fresh ports and a fresh temp dir; returns the process,
    the temp dir and the dashboard address once the dashboard's Serve API answers. Raises
    ChildProcessError when the head exits while starting (its log is in ``log``)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: socket paths
    dashboard_port = _free_port()
    ports = {"port": _free_port(), "dashboard-port": dashboard_port,
             "ray-client-server-port": _free_port(), "dashboard-agent-listen-port": _free_port(),
             "dashboard-agent-grpc-port": _free_port(), "runtime-env-agent-port": _free_port(),
             "metrics-export-port": _free_port(), "node-manager-port": _free_port(),
             "object-manager-port": _free_port()}
    command = [_cli("ray"), "start", "--head", "--block", f"--temp-dir={temp_dir}",
               "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0",
               "--include-dashboard=true", "--dashboard-host=127.0.0.1",
               "--disable-usage-stats", *(f"--{name}={port}" for name, port in ports.items())]
    with open(log, "w") as output:
        head = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(f"{dashboard}/api/serve/applications/"):
        if head.poll() is not None or time.monotonic() > deadline:
            _stop(head, temp_dir)
            raise ChildProcessError(log.read_text()[-3000:])
        time.sleep(1)
    return head, temp_dir, dashboard


@contextmanager
def ray_head(log_dir: Path, attempts: int = 3) -> Iterator[RayHead]:
    """A Ray head of its own for the block's duration; stopped (all its processes) after.
    Ray waits a fixed 30 s for its raylet to register, which a starved machine can miss: a
    head that fails to start is started again, ``attempts`` times in all."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_ADDRESS")}
    # No drain wait on SIGTERM (Serve is shut down first). The agents and the dashboard (and
    # its modules) get 5 min to start, not 30-60 s, which a loaded 2-core machine can exceed.
    env.update(RAY_AUTH_MODE="disabled", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
               RAY_agent_register_timeout_ms="300000", RAY_DASHBOARD_STARTUP_TIMEOUT_S="300",
               RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT="300",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    for attempt in range(1, attempts + 1):
        try:
            head, temp_dir, dashboard = _start_head(env, log_dir / f"ray-start-{attempt}.log")
            break
        except ChildProcessError:
            if attempt == attempts:
                raise
    try:
        yield RayHead(dashboard, env)
    finally:
        _stop(head, temp_dir)


def deploy_config(tmp_path: Path, http_port: int) -> Path:
    """``serve_config.yaml`` as shipped, but on ``http_port`` and with a fresh library."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = http_port
    (application,) = config["applications"]
    application["args"]["library"]["path"] = str(tmp_path / "library")
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.real_model
def test_serve_deploy_of_the_root_config_answers_a_tool_call(tmp_path: Path) -> None:
    http_port = _free_port()
    config = deploy_config(tmp_path, http_port)
    url = f"http://127.0.0.1:{http_port}"
    with ray_head(tmp_path) as head:
        serve = [_cli("serve")]
        subprocess.run([*serve, "deploy", "--address", head.dashboard, str(config)],
                       env=head.env, check=True, timeout=120)
        try:
            assert wait_ready(url, MODEL, READY_TIMEOUT_S), "the deployment never answered"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
            reply = client.chat.completions.create(
                model=MODEL, tools=[WEATHER], max_tokens=64,
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                extra_headers={"x-session-id": "deploy-1", "x-toolspec-tenant": "deploy-test"})
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
