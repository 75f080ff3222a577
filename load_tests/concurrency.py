"""Throughput and latency against concurrency, ToolSpec vs plain decoding, on one deployment.

Against a running ``make serve`` (loopback only), multi-turn tool-calling sessions — API-Bank
level-2 dialogues and BFCL items in OpenAI ``tools`` form (``load_tests/sessions.py``), each
session its own ``x-session-id`` — are sent by N concurrent clients for a fixed time per level
(N = 1, 2, 4, 8, 16), streaming, for

- ``toolspec``: the deployment as configured (``draft_budget`` from ``serve_config.yaml``);
- ``plain``: the same deployment with ``draft_budget: 0`` (plain decoding, still batched),

switched back to back by ``serve deploy`` of the same config with only the ModelServer's
``user_config.draft_budget`` changed (applied in place by ``ModelServer.reconfigure``). The
modes alternate in order from level to level, so drift on a shared machine hits both. The
sessions repeat from level to level, so each level and mode runs as a tenant of its own (a cold
call library and draft caches, as a new deployment would start), unless ``--shared-memory``.

Per level and mode: completion tokens/s, requests/s, TTFT (the first content or tool-call
fragment) and request latency p50/p99, mean tokens per verify step, failures. Writes
``results.json`` and ``concurrency.png`` to ``--out``; prints the issue's goals against the
figures. Bounded: ``--seconds`` per level (requests in flight then finish), 127.0.0.1 only.

    .venv/bin/python load_tests/concurrency.py --url http://127.0.0.1:8000 --out results/conc
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "load_tests"))
from sessions import bfcl_sessions, dialogue_sessions  # noqa: E402

TENANT_HEADER = "x-toolspec-tenant"  # serve_config.yaml's tenant_header


@dataclass(frozen=True)
class RequestRecord:
    mode: str
    concurrency: int
    started: float
    ttft_s: float | None
    latency_s: float
    completion_tokens: int
    mat: float
    status: int
    prefilled_tokens: int = 0  # prompt tokens the replica computed (the rest came from the
    # session's KV cache)


def load_sessions(apibank: Path, bfcl: list[str], seed: int = 0) -> list[dict[str, Any]]:
    sessions = dialogue_sessions(json.loads(apibank.read_text()))
    for spec in bfcl:
        category, _, count = spec.partition(":")
        sessions += bfcl_sessions(category, int(count or 20))
    random.Random(seed).shuffle(sessions)
    return sessions


def stream_request(client: httpx.Client, url: str, payload: dict[str, Any], session: str,
                   mode: str, concurrency: int, tenant: str | None = None) -> RequestRecord:
    """One streamed request: when its first content or tool-call fragment came, when it ended,
    its usage and the ``toolspec`` extension of its last chunk."""
    started = time.perf_counter()
    ttft, tokens, mat, status, prefilled = None, 0, 0.0, 0, 0
    try:
        headers = {"x-session-id": session}
        if tenant is not None:
            headers[TENANT_HEADER] = tenant
        with client.stream("POST", f"{url}/v1/chat/completions", json=payload, timeout=600,
                           headers=headers) as response:
            status = response.status_code
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    status = 599
                    continue
                for choice in chunk.get("choices", ()):
                    delta = choice.get("delta", {})
                    if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                        ttft = time.perf_counter() - started
                    if choice.get("finish_reason"):
                        mat = chunk.get("toolspec", {}).get("mat", 0.0)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    tokens = usage["completion_tokens"]
                    prefilled = usage["prompt_tokens"] - usage.get(
                        "prompt_tokens_details", {}).get("cached_tokens", 0)
    except httpx.HTTPError:
        status = 598
    return RequestRecord(mode, concurrency, started, ttft, time.perf_counter() - started,
                         tokens, mat, status, prefilled)


def run_level(url: str, model: str, sessions: list[dict[str, Any]], mode: str,
              concurrency: int, seconds: float, max_tokens: int,
              tenant: str | None = None) -> list[RequestRecord]:
    """``concurrency`` clients replaying sessions turn by turn until ``seconds`` have passed
    (requests in flight then finish), as ``tenant`` (None: the deployment's default)."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    next_session = iter(range(10**9))

    def client_loop() -> None:
        with httpx.Client() as client:
            while time.perf_counter() < deadline:
                with lock:
                    session = sessions[next(next_session) % len(sessions)]
                session_id = f"{session['id']}-{uuid.uuid4().hex[:8]}"
                for messages in session["turns"]:
                    if time.perf_counter() >= deadline:
                        return
                    payload = {"model": model, "messages": messages, "tools": session["tools"],
                               "max_tokens": max_tokens, "stream": True, "temperature": 0,
                               "stream_options": {"include_usage": True}}
                    record = stream_request(client, url, payload, session_id, mode, concurrency,
                                            tenant)
                    with lock:
                        records.append(record)
                    if record.status != 200:
                        break

    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # staggered arrivals, as sessions start in practice
    for thread in threads:
        thread.join()
    return records


def summarize(records: list[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in records if r.status == 200]
    if not ok:
        return {"requests": len(records), "failed": len(records)}
    span = max(r.started + r.latency_s for r in ok) - min(r.started for r in ok)
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    latencies = sorted(r.latency_s for r in ok)
    return {
        "requests": len(records), "failed": len(records) - len(ok),
        "completion_tokens_per_s": sum(r.completion_tokens for r in ok) / span,
        "prefilled_tokens_per_s": sum(r.prefilled_tokens for r in ok) / span,
        "requests_per_s": len(ok) / span,
        "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p99_s": _quantile(ttfts, 0.99),
        "latency_p50_s": _quantile(latencies, 0.5), "latency_p99_s": _quantile(latencies, 0.99),
        "mean_completion_tokens": statistics.mean(r.completion_tokens for r in ok),
        "mat": statistics.mean(r.mat for r in ok),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def switch_mode(config: Path, draft_budget: int | str, url: str, model: str) -> None:
    """``serve deploy`` ``config`` with the ModelServer's ``user_config.draft_budget`` set,
    then wait until a request is answered in that mode."""
    document = yaml.safe_load(config.read_text())
    for app in document["applications"]:
        for deployment in app.get("deployments", ()):
            if deployment.get("name") == "ModelServer":
                deployment.setdefault("user_config", {})["draft_budget"] = draft_budget
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(document, handle)
    serve = Path(sys.executable).parent / "serve"
    subprocess.run([str(serve), "deploy", handle.name], check=True, capture_output=True)
    probe = {"model": model, "max_tokens": 24, "messages": [
        {"role": "user", "content": 'Repeat exactly: {"name": "x", "arguments": {"a": 1}}'}]}
    plain_wanted = draft_budget == 0
    for _ in range(120):
        time.sleep(1.0)
        try:
            answer = httpx.post(f"{url}/v1/chat/completions", json=probe, timeout=120).json()
        except (httpx.HTTPError, ValueError):
            continue
        mat = answer.get("toolspec", {}).get("mat", 0.0)
        if (mat == 1.0) == plain_wanted and "choices" in answer:
            return
    raise TimeoutError(f"the deployment never answered with draft_budget={draft_budget}")


def plot(levels: dict[str, dict[int, dict[str, Any]]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in (("toolspec", "o-"), ("plain", "s--")):
        rows = levels.get(mode, {})
        counts = sorted(rows)
        left.plot(counts, [rows[c].get("completion_tokens_per_s", 0) for c in counts], style,
                  label=mode)
        right.plot(counts, [rows[c].get("ttft_p99_s") or 0 for c in counts], style,
                   label=f"{mode} TTFT p99")
        right.plot(counts, [rows[c].get("latency_p50_s") or 0 for c in counts], style,
                   alpha=0.45, label=f"{mode} latency p50")
    left.set(xscale="log", xlabel="concurrent sessions", ylabel="completion tokens / s",
             title="throughput")
    right.set(xscale="log", yscale="log", xlabel="concurrent sessions", ylabel="seconds",
              title="time to first token (p99) and latency (p50)")
    for axis in (left, right):
        axis.set_xticks(sorted({c for rows in levels.values() for c in rows}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def goals(levels: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    ours, plain = levels.get("toolspec", {}), levels.get("plain", {})
    lines = []
    if 1 in ours and 8 in ours:
        ratio = ours[8]["completion_tokens_per_s"] / ours[1]["completion_tokens_per_s"]
        lines.append(f"toolspec throughput at 8 / at 1: {ratio:.2f}x (goal >= 4x)")
        ttft = ours[8]["ttft_p99_s"] / ours[1]["ttft_p50_s"]
        lines.append(f"toolspec p99 TTFT at 8 / single-session median TTFT: {ttft:.2f}x "
                     f"(goal <= 3x)")
        ttft = ours[8]["ttft_p99_s"] / ours[1]["ttft_p99_s"]
        lines.append(f"toolspec p99 TTFT at 8 / single-session p99 TTFT: {ttft:.2f}x "
                     f"(the goal read p99 for p99)")
    if 8 in ours and 8 in plain:
        ratio = ours[8]["completion_tokens_per_s"] / plain[8]["completion_tokens_per_s"]
        lines.append(f"toolspec / plain throughput at 8: {ratio:.2f}x (goal >= 2x)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml",
                        help="the config `make serve` deployed (modes differ only in draft_budget)")
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--modes", default="toolspec,plain")
    parser.add_argument("--seconds", type=float, default=90.0, help="per level and mode")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--apibank", type=Path,
                        default=ROOT.parent / "shared" / "data" / "api-bank" / "level-2.json")
    parser.add_argument("--bfcl", action="append", default=None,
                        help="CATEGORY:N BFCL items as one-turn sessions (default "
                             "simple_python:20 and multiple:20)")
    parser.add_argument("--no-switch", action="store_true",
                        help="measure the deployment as it is (one mode, named by --modes)")
    parser.add_argument("--shared-memory", action="store_true",
                        help="send every level as the deployment's default tenant, so the call "
                             "library and draft caches learned in earlier levels serve later "
                             "ones (default: each level and mode a fresh tenant, all starting "
                             "cold)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "concurrency")
    args = parser.parse_args()
    host = urllib.parse.urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("load is sent to loopback addresses only")
    sessions = load_sessions(args.apibank, args.bfcl or ["simple_python:20", "multiple:20"])
    budget = yaml.safe_load(args.config.read_text())["applications"][0]["args"].get(
        "model", {}).get("draft_budget", "auto")
    modes = args.modes.split(",")
    levels = [int(level) for level in args.levels.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    records: list[RequestRecord] = []
    summary: dict[str, dict[int, dict[str, Any]]] = {mode: {} for mode in modes}
    run_id = uuid.uuid4().hex[:8]
    try:
        for number, level in enumerate(levels):
            for mode in (modes if number % 2 == 0 else modes[::-1]):
                if not args.no_switch:
                    switch_mode(args.config, 0 if mode == "plain" else budget, args.url,
                                args.model)
                # The sessions repeat from level to level: a tenant of its own keeps what
                # ToolSpec's memory learned of their answers in one run from drafting another.
                tenant = None if args.shared_memory else f"load-{mode}-{level}-{run_id}"
                level_records = run_level(args.url, args.model, sessions, mode, level,
                                          args.seconds, args.max_tokens, tenant)
                records += level_records
                summary[mode][level] = summarize(level_records)
                print(f"{mode:>9} x{level:<3} {json.dumps(summary[mode][level])}", flush=True)
                (args.out / "results.json").write_text(json.dumps({
                    "url": args.url, "seconds_per_level": args.seconds,
                    "max_tokens": args.max_tokens, "sessions": len(sessions),
                    "levels": summary, "requests": [asdict(r) for r in records]}, indent=1))
    finally:
        if not args.no_switch and "plain" in modes:
            switch_mode(args.config, budget, args.url, args.model)
    plot(summary, args.out / "concurrency.png")
    print("\n".join(goals(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
