"""Distributed for real: the deployment on a multi-node Ray cluster, and a node lost under load.

The cluster is Ray's own multi-node harness on this machine (``ray.cluster_utils.Cluster``: a
head raylet and two worker raylets, each with its own CPUs and a custom resource), placed as
``deployments/app/builder.py``'s options place it on a real cluster: the HTTP proxy and the ingress
on the head (``proxy_location: HeadOnly``, ``ingress_resources``), one model replica per worker
(``model.resources``, ``max_replicas_per_node: 1``), the retrieval actor on worker 2
(``library.resources``) with its LMDB directory on a path every node sees (here a local
directory; on KubeRay the persistent volume). Phases, each bounded in time:

1. **placement**: the node of the proxy, the ingress, each model replica and the library actor;
2. **across nodes**: requests through the head's proxy, answered by replicas on the workers,
   whose finished calls reach the library actor on worker 2;
3. **a replica's node lost under load**: ``--clients`` clients (half streaming) for
   ``--seconds``; a third of the way in, worker 1 is removed ungracefully (``remove_node``);
   later a node with the same resources is added. Per kind of request: succeeded, failed (an
   HTTP error, or a stream that ended with an error event), hung (no end within the timeout);
   how long until two replicas run again after the node returned;
4. **the library's node lost**: the calls the library holds are counted, worker 2 (the library
   and the other replica) is removed, requests go on (lookups fail fast), a node with the
   library's resource is added; the actor restarts there and the calls are counted again;
5. **a two-rank replica** (``--tensor-parallel``: the default model's real weights, split in
   two): both ranks on the one node with ``toolspec-tp`` (``STRICT_PACK``); its worker rank
   killed (``ray.kill``), the replica fails its health check and Serve builds a new group that
   answers; then that node lost, the whole group comes back on the next such node. Each
   answer's call is recorded.

Prints and writes ``results.json`` in ``--out``. ``--engine scripted`` (default: a scripted
engine, no model: what is measured is the serving system's fault handling) or ``real`` (the
default model). Loopback only; stops by itself.

    .venv/bin/python load_tests/cluster_faults.py --out results/cluster
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "load_tests"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ["PYTHONPATH"] = os.pathsep.join(  # the raylets' workers import this checkout
    [str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import httpx  # noqa: E402
import ray  # noqa: E402
from faults import Outcome, load  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app  # noqa: E402
from deployments.app.builder import ResponsesConfig  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CITIES = ["Oslo", "Rome", "Lima", "Kyiv", "Pune", "Baku", "Doha", "Riga"]
WORKER = {"toolspec-model": 1}  # what marks a node for model replicas
LIBRARY = {"toolspec-library": 1}  # what marks the node for the retrieval actor


def scripted_engine(step_s: float) -> Any:
    """Each request answers with one call to get_weather for the city its message names."""
    from serve_fakes import scripted_factory

    def script(request: Any) -> list[str]:
        text = str(request.messages[-1].get("content", ""))
        city = next((c for c in CITIES if c in text), "Oslo")
        call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + city +
                '"}}\n</tool_call>')
        return [call[:14], call[14:40], call[40:]]
    return scripted_factory(script, step_s=step_s)


def start_cluster(cpus: float) -> tuple[Cluster, dict[str, Any]]:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus, "resources": {"toolspec-head": 1}, "include_dashboard": True,
        # A lost node is declared dead after three missed checks a second apart (sooner than
        # Ray's defaults), so the runs wait less for what they measure after it.
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    workers = {"worker-1": cluster.add_node(num_cpus=cpus, resources=dict(WORKER)),
               "worker-2": cluster.add_node(num_cpus=cpus, resources={**WORKER, **LIBRARY})}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster, workers


def config(library_path: Path, responses_path: Path, engine: str) -> AppConfig:
    real = engine == "real"
    return AppConfig(
        model=ModelConfig(model=MODEL, dtype="float32" if real else "auto", draft_budget=8,
                          replicas=2, max_replicas_per_node=1, resources=dict(WORKER),
                          num_cpus=0.5 if real else 0, max_ongoing_requests=8,
                          max_queued_requests=64),
        library=LibraryConfig(path=str(library_path), num_cpus=0, resources=dict(LIBRARY)),
        # The stored responses' one owner, on the head beside the ingress it serves.
        responses=ResponsesConfig(path=str(responses_path), num_cpus=0,
                                  resources={"toolspec-head": 0.1}),
        ingress_resources={"toolspec-head": 0.1}, expose_replica=True,
        count_prompt_tokens_at_ingress=real, request_timeout_s=60, default_max_tokens=48)


def placement(nodes: dict[str, str], app: str = "cluster") -> dict[str, list[str]]:
    """Where each actor of ``app`` runs (and the proxy, and rank workers), by node name
    (``nodes``: node id → name)."""
    where: dict[str, list[str]] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], limit=1000):
        name = actor.class_name
        if name.startswith("ServeReplica:") and not name.startswith(f"ServeReplica:{app}:"):
            continue
        for kind in ("ProxyActor", "Ingress", "ModelServer", "CallLibraryService",
                     "ResponseStore", "RankWorker"):
            if name == kind or name.endswith(f":{kind}"):
                where.setdefault(kind, []).append(nodes.get(actor.node_id, actor.node_id))
    return {kind: sorted(found) for kind, found in where.items()}


def model_replicas_running(app: str = "cluster") -> int:
    status = serve.status().applications[app].deployments["ModelServer"]
    return status.replica_states.get("RUNNING", 0)


def replicas_back(nodes: dict[str, str], lost: str, app: str = "cluster",
                  replicas: int = 2) -> bool:
    """``replicas`` model replicas run, none on the ``lost`` node (right after a node is lost,
    Serve still counts its replica as running until its health check fails)."""
    placed = placement(nodes, app).get("ModelServer", [])
    return model_replicas_running(app) == replicas and lost not in placed


def wait_until(condition: Any, timeout_s: float, pause_s: float = 0.5) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if condition():
                return time.monotonic() - began
        except Exception:  # noqa: BLE001 - the cluster is changing under us: ask again
            pass
        time.sleep(pause_s)
    return None


def library_calls() -> int:
    handle = serve.get_deployment_handle("CallLibraryService", app_name="cluster")
    return handle.stats.remote().result(timeout_s=20)["calls"]


# The load: one-turn sessions asking for a city's weather (what the scripted engine answers).
SESSIONS = [{"tools": [WEATHER], "turns": [[{"role": "user", "content": f"Weather in {city}?"}]]}
            for city in CITIES]


def request_payload(index: int, max_tokens: int) -> dict[str, Any]:
    city = CITIES[index % len(CITIES)]
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "tools": [WEATHER],
            "messages": [{"role": "user", "content": f"Weather in {city}?"}]}


def across_nodes(url: str, requests: int, max_tokens: int) -> dict[str, Any]:
    replicas: Counter[str] = Counter()
    failed = 0
    with httpx.Client() as client:
        for index in range(requests):
            answer = client.post(f"{url}/v1/chat/completions", timeout=120,
                                 json=request_payload(index, max_tokens))
            if answer.status_code != 200:
                failed += 1
                continue
            replicas[answer.json()["toolspec"]["replica"]] += 1
    reached = wait_until(lambda: library_calls() >= min(requests, len(CITIES)), 60)
    return {"requests": requests, "failed": failed, "replicas_answering": len(replicas),
            "library_calls": library_calls(), "calls_reached_library_s": reached}


def under_load(url: str, clients: int, seconds: float, timeout_s: float, max_tokens: int,
               action: Any) -> tuple[list[Outcome], Any]:
    """``clients`` clients (``faults.load``, a session each) for ``seconds``; ``action()``
    runs a third of the way in."""
    stop = threading.Event()
    outcomes: list[Outcome] = []
    worker = threading.Thread(target=lambda: outcomes.extend(load(
        url, MODEL, SESSIONS, clients, stop, time.monotonic(), timeout_s, max_tokens,
        session_ids=True)))
    worker.start()
    time.sleep(seconds / 3)
    acted = action()
    time.sleep(seconds * 2 / 3)
    stop.set()
    worker.join(timeout=timeout_s + 60)
    return outcomes, acted


def tally(outcomes: list[Outcome]) -> dict[str, Any]:
    counts = {kind: Counter(o.result for o in outcomes if o.stream == (kind == "stream"))
              for kind in ("plain", "stream")}
    details = Counter(o.detail for o in outcomes if o.result != "ok")
    return {kind: dict(count) for kind, count in counts.items()} | {
        "failures": dict(details.most_common(5))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster, workers = start_cluster(args.cpus_per_node)
    report: dict[str, Any] = {"engine": args.engine, "clients": args.clients,
                              "seconds": args.seconds}
    shared = Path(tempfile.mkdtemp(prefix="toolspec-cluster-"))
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port, "location": "HeadOnly"})
        engine = scripted_engine(args.step_s) if args.engine == "scripted" else None
        serve.run(build_app(config(shared / "library", shared / "responses", args.engine),
                            engine), name="cluster", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        nodes = {cluster.head_node.node_id: "head",
                 **{node.node_id: name for name, node in workers.items()}}
        report["placement"] = placement(nodes)
        report["across_nodes"] = across_nodes(url, args.warmup_requests, args.max_tokens)

        # A replica's node, lost ungracefully under load, then a node back in its place.
        def lose_worker_1() -> float:
            cluster.remove_node(workers.pop("worker-1"), allow_graceful=False)
            return time.monotonic()

        outcomes, _ = under_load(url, args.clients, args.seconds, args.timeout_s,
                                 args.max_tokens, lose_worker_1)
        workers["worker-3"] = cluster.add_node(num_cpus=args.cpus_per_node,
                                               resources=dict(WORKER))
        nodes[workers["worker-3"].node_id] = "worker-3"
        back = wait_until(lambda: replicas_back(nodes, "worker-1"), args.recovery_timeout_s)
        report["replica_node_lost"] = {
            **tally(outcomes),
            "full_capacity_after_node_added_s": None if back is None else round(back, 1),
            "placement_after": placement(nodes)}

        # The library's node: its calls must survive on the next node that mounts the path.
        before = library_calls()
        outcomes, _ = under_load(url, args.clients, args.seconds / 2, args.timeout_s,
                                 args.max_tokens, lambda: cluster.remove_node(
                                     workers.pop("worker-2"), allow_graceful=False))
        workers["worker-4"] = cluster.add_node(num_cpus=args.cpus_per_node,
                                               resources={**WORKER, **LIBRARY})
        nodes[workers["worker-4"].node_id] = "worker-4"
        restarted = wait_until(lambda: library_calls() >= 0, args.recovery_timeout_s)
        after = library_calls() if restarted is not None else None
        capacity = wait_until(lambda: replicas_back(nodes, "worker-2"),
                              args.recovery_timeout_s)
        report["library_node_lost"] = {
            **tally(outcomes), "calls_before": before, "calls_after": after,
            "calls_lost": None if after is None else max(0, before - after),
            "library_back_after_node_added_s": None if restarted is None
            else round(restarted, 1),
            "full_capacity_after_node_added_s": None if capacity is None
            else round(restarted + capacity, 1),
            "placement_after": placement(nodes)}
        if args.tensor_parallel:
            report["tensor_parallel"] = split_replica(cluster, workers, nodes, url, args)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return report


def split_replica(cluster: Cluster, workers: dict[str, Any], nodes: dict[str, str], url: str,
                  args: argparse.Namespace) -> dict[str, Any]:
    """A two-rank replica of the default model (real weights, fp32) on the one node with the
    ``toolspec-tp`` resource: both ranks there (STRICT_PACK); its worker rank killed, a new
    group answers; that node lost, the whole group comes back on the next such node."""
    from deployments.replica.tensor_parallel_group import WORKER_NAME_PREFIX

    tp = {"toolspec-tp": 0.5}  # per rank: a node with toolspec-tp 1 holds both
    workers["worker-5"] = cluster.add_node(num_cpus=args.cpus_per_node,
                                           resources={"toolspec-tp": 1})
    nodes[workers["worker-5"].node_id] = "worker-5"
    # Checked every 2 s (Serve's default is 10): a lost rank is found within seconds.
    config = AppConfig(model=ModelConfig(model=MODEL, dtype="float32", draft_budget=7,
                                         num_cpus=0.5, tensor_parallel_size=2, resources=tp,
                                         health_check_period_s=2.0),
                       library=LibraryConfig(enabled=False), responses=ResponsesConfig(
                           enabled=False), ingress_resources={"toolspec-head": 0.1},
                       default_max_tokens=24)
    serve.run(build_app(config), name="split", route_prefix="/split")
    base = f"{url}/split"
    calls = [answered_call(base)]
    before = placement(nodes, "split")

    def rank_workers() -> list[dict[str, str]]:
        return [actor for actor in ray.util.list_named_actors(all_namespaces=True)
                if actor["name"].startswith(WORKER_NAME_PREFIX)]

    (killed,) = rank_workers()
    ray.kill(ray.get_actor(killed["name"], namespace=killed["namespace"]), no_restart=True)
    # The next health check fails the replica; Serve builds a new group (a new worker name).
    rebuilt, call = answered_once(base, lambda: any(
        worker["name"] != killed["name"] for worker in rank_workers()), args.recovery_timeout_s)
    calls.append(call)
    after_kill = placement(nodes, "split")
    cluster.remove_node(workers.pop("worker-5"), allow_graceful=False)
    workers["worker-6"] = cluster.add_node(num_cpus=args.cpus_per_node,
                                           resources={"toolspec-tp": 1})
    nodes[workers["worker-6"].node_id] = "worker-6"
    back, call = answered_once(base, lambda: replicas_back(nodes, "worker-5", "split", 1),
                               args.recovery_timeout_s)
    calls.append(call)
    after = placement(nodes, "split")
    serve.delete("split")
    return {"answered_before": calls[0] is not None,
            "answered_after_rank_killed_s": None if rebuilt is None else round(rebuilt, 1),
            "answered_after_node_added_s": None if back is None else round(back, 1),
            "ranks_before": _ranks(before), "ranks_after_rank_killed": _ranks(after_kill),
            "ranks_after": _ranks(after), "calls": calls}


def _ranks(placed: dict[str, list[str]]) -> list[str]:
    """The nodes of a split replica's ranks: the replica (rank 0) and its rank workers."""
    return sorted(placed.get("ModelServer", []) + placed.get("RankWorker", []))


def answered_once(base: str, ready: Callable[[], bool], timeout_s: float
                  ) -> tuple[float | None, tuple[str, Any] | None]:
    """Seconds until ``ready()`` holds and a required call is answered (None: not within
    ``timeout_s`` times two: the group reloads the weights), and that call."""
    answer: list[tuple[str, Any] | None] = [None]

    def answered() -> bool:
        if not ready():
            return False
        answer[0] = answered_call(base)
        return answer[0] is not None

    return wait_until(answered, timeout_s * 2, pause_s=3), answer[0]


def answered_call(base: str) -> tuple[str, Any] | None:
    """The call (name, arguments) a required-call request for Oslo's weather got, or None."""
    try:
        reply = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            **request_payload(0, 24), "tool_choice": "required"})
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    calls = reply.json()["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        return None
    return calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["scripted", "real"], default="scripted")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0, help="load per node loss")
    parser.add_argument("--warmup-requests", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    parser.add_argument("--recovery-timeout-s", type=float, default=120.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--step-s", type=float, default=0.05, help="scripted: per step")
    parser.add_argument("--cpus-per-node", type=float, default=1.0)
    parser.add_argument("--tensor-parallel", action="store_true",
                        help="also a two-rank replica of the default model (real weights) "
                             "placed on one node, and replaced whole when that node is lost")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "cluster")
    args = parser.parse_args()
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
