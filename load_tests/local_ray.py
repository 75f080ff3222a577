"""A Ray head of one's own, for what must run the deployment as users do (``ray start`` and
``serve deploy``): the deploy test, the peer benchmark.

``ray_head`` starts ``ray start --head --block`` on fresh ports and a fresh temp dir, waits
until its dashboard's Serve API answers, and on leaving stops it and every process it started
(never ``ray stop``, which would stop any Ray on the machine). Its workers import this checkout
first (PYTHONPATH), whatever the venv holds.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 600


@dataclass(frozen=True)
class RayHead:
    dashboard: str  # what `serve deploy --address` takes
    env: dict[str, str]  # the environment the Ray CLIs run with
    pid: int  # `ray start --block`'s process: every Ray process of this head descends from it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli(name: str) -> str:
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
    """Stop a head and every process it started (those naming its temp dir, and every
    descendant — vLLM's engine processes rename themselves); drop the dir."""
    import psutil

    try:
        descendants = psutil.Process(head.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    head.terminate()  # `ray start --block` stops every process it started on SIGTERM
    try:
        head.wait(timeout=120)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    for pid in {*_processes_under(temp_dir), *(p.pid for p in descendants)}:
        try:  # anything that outlived it
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


def _start_head(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, Path, str]:
    """``ray start --head --block`` on fresh ports and a fresh temp dir; returns the process,
    the temp dir and the dashboard address once the dashboard's Serve API answers. Raises
    ChildProcessError when the head exits while starting (its log is in ``log``)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: socket paths
    dashboard_port = free_port()
    ports = {"port": free_port(), "dashboard-port": dashboard_port,
             "ray-client-server-port": free_port(), "dashboard-agent-listen-port": free_port(),
             "dashboard-agent-grpc-port": free_port(), "runtime-env-agent-port": free_port(),
             "metrics-export-port": free_port(), "node-manager-port": free_port(),
             "object-manager-port": free_port()}
    command = [cli("ray"), "start", "--head", "--block", f"--temp-dir={temp_dir}",
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
def ray_head(log_dir: Path, attempts: int = 3, worker_niceness: int = 0) -> Iterator[RayHead]:
    """A Ray head of its own for the block's duration; stopped (all its processes) after.
    Ray waits a fixed 30 s for its raylet to register, which a starved machine can miss: a
    head that fails to start is started again, ``attempts`` times in all. Its workers run at
    ``worker_niceness`` (as ``make serve`` starts them: 0; Ray's own default is 15)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_ADDRESS")}
    # No drain wait on SIGTERM (Serve is shut down first). The agents and the dashboard (and
    # its modules) get 5 min to start, not 30-60 s, which a loaded 2-core machine can exceed.
    env.update(RAY_AUTH_MODE="disabled", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
               RAY_worker_niceness=str(worker_niceness),
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
        yield RayHead(dashboard, env, head.pid)
    finally:
        _stop(head, temp_dir)
