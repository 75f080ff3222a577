"""Autoscaling under a load that steps 1 → 16 → 1 sessions: replicas over time, and no request
lost.

Against a running ``make serve`` deployed with ``args.model.autoscaling`` (loopback only): the
same tool-calling sessions as ``load_tests/concurrency.py`` are replayed by 1 client for
``--low`` seconds, by 16 for ``--high`` seconds, then by 1 again for ``--tail`` seconds, as one
cold tenant. Every two seconds the ingress's ``/health`` says how many ``ModelServer`` replicas
are running, starting or stopping (Ray Serve's view). Requests in flight when a phase ends
finish. Writes ``results.json`` (timeline, every request) and ``autoscale.png`` to ``--out``,
and prints how far the replicas went up and back down and how many requests failed.

    .venv/bin/python load_tests/autoscale.py --out results/autoscale
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "load_tests"))
from concurrency import RequestRecord, load_sessions, stream_request  # noqa: E402

from toolspec.bench.datasets import apibank_file  # noqa: E402


def replica_states(url: str) -> dict[str, int]:
    try:
        report = httpx.get(f"{url}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return dict(report.get("deployments", {}).get("ModelServer", {}).get("replicas", {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--low", type=float, default=60.0, help="seconds at 1 session first")
    parser.add_argument("--high", type=float, default=240.0, help="seconds at --peak sessions")
    parser.add_argument("--tail", type=float, default=180.0, help="seconds at 1 session after")
    parser.add_argument("--peak", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--apibank", type=apibank_file, default="apibank:level-2",
                        help="API-Bank dialogues: apibank:level-1, apibank:level-2 or a JSON file")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "autoscale")
    args = parser.parse_args()
    if urllib.parse.urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("load is sent to loopback addresses only")
    sessions = load_sessions(args.apibank, ["simple_python:20", "multiple:20"])
    tenant = f"autoscale-{uuid.uuid4().hex[:8]}"
    settle(args.url)
    phases = [(1, args.low), (args.peak, args.high), (1, args.tail)]
    wanted = {"clients": 1}
    began = time.perf_counter()
    stop = threading.Event()
    records: list[RequestRecord] = []
    lock = threading.Lock()
    next_session = iter(range(10**9))

    def client(number: int) -> None:
        with httpx.Client() as http:
            while not stop.is_set():
                if number >= wanted["clients"]:
                    time.sleep(0.5)
                    continue
                with lock:
                    session = sessions[next(next_session) % len(sessions)]
                session_id = f"{session['id']}-{uuid.uuid4().hex[:8]}"
                for messages in session["turns"]:
                    if stop.is_set() or number >= wanted["clients"]:
                        break
                    payload = {"model": args.model, "messages": messages,
                               "tools": session["tools"], "max_tokens": args.max_tokens,
                               "stream": True, "temperature": 0,
                               "stream_options": {"include_usage": True}}
                    record = stream_request(http, args.url, payload, session_id, "toolspec",
                                            wanted["clients"], tenant)
                    with lock:
                        records.append(record)

    timeline: list[dict[str, Any]] = []

    def watch() -> None:
        while not stop.is_set():
            timeline.append({"t": time.perf_counter() - began, "clients": wanted["clients"],
                             "replicas": replica_states(args.url)})
            stop.wait(2.0)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.peak)]
    watcher = threading.Thread(target=watch)
    for thread in [*threads, watcher]:
        thread.start()
    try:
        for clients, seconds in phases:
            wanted["clients"] = clients
            print(f"{time.perf_counter() - began:7.1f} s: {clients} sessions for {seconds:.0f} s",
                  flush=True)
            time.sleep(seconds)
    finally:
        stop.set()
        for thread in [*threads, watcher]:
            thread.join(timeout=600)
    summary = summarize(timeline, records, phases)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({
        "phases": phases, "tenant": tenant, "summary": summary, "timeline": timeline,
        "requests": [{**asdict(r), "started": r.started - began} for r in records]}, indent=1))
    plot(timeline, records, began, args.out / "autoscale.png")
    print(json.dumps(summary, indent=1))
    return 0 if summary["failed"] == 0 else 1


def settle(url: str, seconds: float = 600) -> None:
    """Wait until Serve runs the model replicas steadily (none starting or stopping): a
    deployment just updated may still be replacing replicas."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = replica_states(url)
        if states.get("RUNNING") and set(states) == {"RUNNING"}:
            return
        time.sleep(2)
    raise TimeoutError(f"the ModelServer replicas never settled: {replica_states(url)}")


def summarize(timeline: list[dict[str, Any]], records: list[RequestRecord],
              phases: list[tuple[int, float]]) -> dict[str, Any]:
    """Replicas in each phase, how long after the load stepped up the most of them ran, and
    how long after it stepped down they were back to where they started."""
    running = [(point["t"], point["replicas"].get("RUNNING", 0)) for point in timeline]
    up_at, down_at = phases[0][1], phases[0][1] + phases[1][1]
    start = running[0][1] if running else 0
    high = [(t, count) for t, count in running if up_at <= t < down_at]
    peak = max((count for _, count in high), default=start)
    scaled_up = next((t - up_at for t, count in high if count == peak), None)
    scaled_down = next((t - down_at for t, count in running if t >= down_at and count <= start),
                       None)
    return {"requests": len(records), "failed": sum(r.status != 200 for r in records),
            "replicas_at_start": start, "replicas_peak": peak,
            "replicas_at_end": running[-1][1] if running else None,
            "all_peak_replicas_running_after_step_up_s": scaled_up,
            "back_to_start_after_step_down_s": scaled_down}


def plot(timeline: list[dict[str, Any]], records: list[RequestRecord], began: float,
         out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (load, latency) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    times = [point["t"] for point in timeline]
    load.step(times, [point["clients"] for point in timeline], where="post", label="sessions")
    for state in ("RUNNING", "STARTING", "STOPPING"):
        counts = [point["replicas"].get(state, 0) for point in timeline]
        if any(counts):
            load.step(times, counts, where="post", label=f"replicas {state.lower()}")
    load.set(ylabel="count", title="ModelServer replicas under a 1 → 16 → 1 session load")
    ok = [r for r in records if r.status == 200]
    failed = [r for r in records if r.status != 200]
    latency.scatter([r.started - began + r.latency_s for r in ok], [r.latency_s for r in ok],
                    s=8, label="request latency (at its end)")
    if failed:
        latency.scatter([r.started - began + r.latency_s for r in failed],
                        [r.latency_s for r in failed], s=20, marker="x", color="red",
                        label="failed")
    latency.set(xlabel="seconds", ylabel="seconds", yscale="log")
    for axis in (load, latency):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
