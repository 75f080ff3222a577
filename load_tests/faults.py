"""Fault injection under load: kill -9 a model replica, then the retrieval actor, mid-traffic.

Deploys ``serve_config.yaml`` with two ModelServer replicas (on a running Ray: ``make serve``
first, or ``ray start --head``), then 8 clients (half streaming, half not) send tool-calling
requests (first turns of the load-test sessions) to 127.0.0.1 while the script

1. kills one model replica's process with SIGKILL and waits until Serve runs two again;
2. counts the calls the library holds, kills the retrieval actor's process with SIGKILL,
   waits until it runs again and counts them again.

Reported (printed, and ``results.json`` in ``--out``): per kind of request how many succeeded,
failed (an HTTP error, or a stream that ended with an error event) or hung (no end within the
client's timeout); how long each restart took; library calls lost (counted before the kill and
after the restart). The goals: 0 failed non-streaming requests (a request whose
replica dies is retried once elsewhere), streams end with an error event never a hang,
0 committed library calls lost, both restarted. Bounded: about ``--seconds`` of load, every
request with a timeout.

    .venv/bin/python load_tests/faults.py --out results/faults
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import ray
import yaml
from ray import serve

from toolspec.bench.datasets import apibank_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "load_tests"))
from sessions import bfcl_sessions, dialogue_sessions  # noqa: E402

APP = "toolspec"


@dataclass(frozen=True)
class Outcome:
    stream: bool
    started: float  # seconds since the load began
    latency_s: float
    result: str  # ok, failed, hung
    detail: str = ""


def deploy(config: Path, replicas: int | None = None, cpus_per_replica: float | None = None
           ) -> None:
    """``config`` deployed afresh (the running application deleted first: a rolling update
    of the replicas' CPUs would need the old and new replicas' CPUs at once, more than a
    small machine has), with ``replicas`` ModelServer replicas of ``cpus_per_replica`` CPUs
    each where given."""
    document = yaml.safe_load(config.read_text())
    for app in document["applications"]:
        for deployment in app.get("deployments", ()):
            if deployment.get("name") == "ModelServer" and replicas is not None:
                deployment["num_replicas"] = replicas
                deployment.setdefault("ray_actor_options", {})["num_cpus"] = cpus_per_replica
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(document, handle)
    serve.delete(APP)
    serve_cli = Path(sys.executable).parent / "serve"
    subprocess.run([str(serve_cli), "deploy", handle.name], check=True, capture_output=True)


def running(deployment: str) -> int:
    status = serve.status().applications.get(APP)
    if status is None or deployment not in status.deployments:
        return 0
    states = status.deployments[deployment].replica_states
    return sum(count for state, count in states.items()
               if str(getattr(state, "value", state)) == "RUNNING")


def wait_running(deployment: str, count: int, timeout_s: float) -> float | None:
    """Seconds until ``deployment`` runs ``count`` replicas (None past ``timeout_s``)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if running(deployment) >= count:
            return time.monotonic() - began
        time.sleep(0.5)
    return None


def restart_s(deployment: str, count: int, killed: float, timeout_s: float) -> float | None:
    """Seconds from the kill at ``killed`` until Serve has seen the replica die and runs
    ``count`` again (None past ``timeout_s``)."""
    while running(deployment) >= count and time.monotonic() - killed < 60:
        time.sleep(0.2)  # Serve's health check has not noticed yet
    if wait_running(deployment, count, timeout_s) is None:
        return None
    return time.monotonic() - killed


def replica_pids(deployment: str) -> list[int]:
    """The process ids of ``deployment``'s replica actors."""
    pids = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if f"#{deployment}#" in actor["name"] and APP in actor["name"]:
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            try:
                pids.append(ray.get(handle.__ray_call__.remote(lambda _: os.getpid()),
                                    timeout=30))
            except Exception:  # noqa: BLE001 - a replica already gone
                continue
    return pids


def library_calls() -> int | None:
    try:
        handle = serve.get_deployment_handle("CallLibraryService", app_name=APP)
        return handle.stats.remote().result(timeout_s=30)["calls"]
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


def one_request(client: httpx.Client, url: str, payload: dict[str, Any], stream: bool,
                timeout_s: float, headers: dict[str, str] | None = None) -> tuple[str, str]:
    """(result, detail) of one request."""
    try:
        if not stream:
            response = client.post(f"{url}/v1/chat/completions", json=payload,
                                   timeout=timeout_s, headers=headers)
            if response.status_code == 200:
                return "ok", ""
            return "failed", f"{response.status_code} {response.text[:120]}"
        with client.stream("POST", f"{url}/v1/chat/completions", timeout=timeout_s,
                           json={**payload, "stream": True}, headers=headers) as response:
            if response.status_code != 200:
                return "failed", str(response.status_code)
            error, done = "", False
            for line in response.iter_lines():
                if line.startswith("data: {") and '"error"' in line[:20]:
                    error = json.loads(line[6:])["error"].get("code") or "error"
                done = done or line == "data: [DONE]"
            if error:
                return "failed", f"error event: {error}"
            return ("ok", "") if done else ("failed", "ended without [DONE]")
    except httpx.TimeoutException:
        return "hung", f"no end within {timeout_s:.0f} s"
    except httpx.HTTPError as error:
        return "failed", type(error).__name__


def load(url: str, model: str, sessions: list[dict[str, Any]], clients: int,
         stop: threading.Event, began: float, timeout_s: float, max_tokens: int,
         session_ids: bool = False) -> list[Outcome]:
    """``clients`` clients (odd ones streaming) sending first turns of ``sessions`` until
    ``stop``; ``session_ids``: each client sends its own ``x-session-id`` (its requests stay
    on one replica while it lives)."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        rng = random.Random(index)
        stream = index % 2 == 1
        headers = {"x-session-id": f"client-{index}"} if session_ids else None
        with httpx.Client() as client:
            while not stop.is_set():
                session = rng.choice(sessions)
                payload = {"model": model, "messages": session["turns"][0],
                           "tools": session["tools"], "max_tokens": max_tokens,
                           "temperature": 0}
                started = time.monotonic()
                result, detail = one_request(client, url, payload, stream, timeout_s, headers)
                with lock:
                    outcomes.append(Outcome(stream, started - began,
                                            time.monotonic() - started, result, detail))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join()
    return outcomes


def kill(pids: list[int], what: str) -> int:
    if not pids:
        raise RuntimeError(f"no process found for {what}")
    os.kill(pids[0], signal.SIGKILL)
    print(f"killed {what} (pid {pids[0]})", flush=True)
    return pids[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--cpus-per-replica", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=20.0,
                        help="load before each kill, and after the last restart")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per request")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--apibank", type=apibank_file, default="apibank:level-2",
                        help="API-Bank dialogues: apibank:level-1, apibank:level-2 or a JSON file")
    parser.add_argument("--out", type=Path, default=ROOT / "results/faults")
    args = parser.parse_args()
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost"):
        parser.error("fault injection sends traffic to loopback addresses only")

    ray.init(address="auto", namespace="serve", log_to_driver=False)
    deploy(args.config, 2, args.cpus_per_replica)
    if wait_running("ModelServer", 2, 600) is None:
        raise TimeoutError("two model replicas never ran")
    sessions = dialogue_sessions(json.loads(args.apibank.read_text())) + \
        bfcl_sessions("simple_python", 20)
    stop, began = threading.Event(), time.monotonic()
    outcomes: list[Outcome] = []
    worker = threading.Thread(target=lambda: outcomes.extend(load(
        args.url, args.model, sessions, args.clients, stop, began, args.timeout_s,
        args.max_tokens)))
    worker.start()
    report: dict[str, Any] = {"clients": args.clients}
    try:
        time.sleep(args.settle_s)
        report["replica_killed_at_s"] = time.monotonic() - began
        kill(replica_pids("ModelServer"), "a model replica")
        report["replica_restart_s"] = restart_s("ModelServer", 2, time.monotonic(), 600)
        print(f"model replicas back to 2 after {report['replica_restart_s']} s", flush=True)
        time.sleep(args.settle_s)
        report["library_calls_before_kill"] = library_calls()
        report["library_killed_at_s"] = time.monotonic() - began
        kill(replica_pids("CallLibraryService"), "the retrieval actor")
        report["library_restart_s"] = restart_s("CallLibraryService", 1, time.monotonic(), 300)
        report["library_calls_after_restart"] = library_calls()
        print(f"retrieval actor back after {report['library_restart_s']} s", flush=True)
        time.sleep(args.settle_s)
    finally:
        stop.set()
        worker.join()
    before, after = report["library_calls_before_kill"], report["library_calls_after_restart"]
    report["library_calls_lost"] = None if before is None or after is None \
        else max(0, before - after)
    for kind, stream in (("non_streaming", False), ("streaming", True)):
        mine = [o for o in outcomes if o.stream == stream]
        report[kind] = {result: sum(o.result == result for o in mine)
                        for result in ("ok", "failed", "hung")}
        report[kind]["failures"] = sorted({o.detail for o in mine if o.result != "ok"})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {**report, "requests": [asdict(o) for o in outcomes]}, indent=1))
    print(json.dumps(report, indent=1))
    goals = [
        ("0 failed non-streaming requests",
         report["non_streaming"]["failed"] + report["non_streaming"]["hung"] == 0),
        ("streams end (an error event at worst), never hang", report["streaming"]["hung"] == 0),
        ("0 committed library calls lost", report["library_calls_lost"] == 0),
        ("both restarted", report["replica_restart_s"] is not None
         and report["library_restart_s"] is not None),
    ]
    for goal, met in goals:
        print(f"{'met   ' if met else 'MISSED'} {goal}")
    deploy(args.config)  # back to the shipped shape
    return 0


if __name__ == "__main__":
    sys.exit(main())
