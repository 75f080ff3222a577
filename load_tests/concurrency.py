"""Throughput and latency against concurrency, ToolSpec vs plain decoding, on one deployment.

Against a running ``make serve`` (loopback only), multi-turn tool-calling sessions — API-Bank
level-2 dialogues and BFCL items in OpenAI ``tools`` form (``load_tests/sessions.py``), each
session its own ``x-session-id`` — are sent by N concurrent clients for a fixed time per level
(N = 1, 2, 4, 8, 16), streaming, for

- ``toolspec``: the deployment as configured (``draft_budget`` from ``serve_config.yaml``);
- ``plain``: the same deployment with ``draft_budget: 0`` (plain decoding, still batched, with
  the same prefix cache and row budget),

switched back to back by ``serve deploy`` of the config with only the ModelServer's
``user_config.draft_budget`` changed (applied in place by ``ModelServer.reconfigure``). The
deployment measured has ``--replicas`` fixed replicas (autoscaling off) routed by
``--routing``. The modes alternate in order from level to level, so drift on a shared machine
hits both. The sessions repeat from level to level, so each level and mode runs as a tenant of
its own (a cold call library, draft caches and prefix cache, as a new deployment would start),
unless ``--shared-memory``.

Per level and mode: completion tokens/s, requests/s, TTFT (the first content or tool-call
fragment) and request latency p50/p99, inter-token latency p50/p99 (per request: the time after
its first fragment over the tokens after its first), mean tokens per verify step, the share of
prompt tokens taken from the prefix cache, the share of forward rows that were prompt rows (each
request's computed prompt rows and decoding rows, as its ``toolspec.rows`` reports them),
failures. Writes ``results.json`` and ``concurrency.png`` to ``--out``; prints the issue's goals
against the figures. Bounded: ``--seconds`` per level (requests in flight then finish),
127.0.0.1 only.

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

from toolspec.bench.datasets import apibank_file

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
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the replica's prefix cache held
    prompt_rows: int = 0  # forward rows of its prompt the replica computed
    decode_rows: int = 0  # forward rows its decoding steps ran
    tools: str = ""  # which tool set it offered (the session's, shortened)
    key: str = ""  # which request it was (the same across runs: session and turn)
    output: str = ""  # the content it streamed
    calls: tuple[tuple[str, Any], ...] = ()  # the tool calls it streamed: (name, arguments)

    @property
    def inter_token_s(self) -> float | None:
        """Seconds per token after the first fragment (None with fewer than two tokens)."""
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


def load_sessions(apibank: Path, bfcl: list[str], seed: int = 0, skip: int = 0,
                  limit: int | None = None) -> list[dict[str, Any]]:
    """API-Bank dialogues (``limit`` from item ``skip`` on) and BFCL items (``CATEGORY:N``
    each), as sessions in a shuffled order (the same for the same arguments)."""
    items = json.loads(apibank.read_text())[skip:]
    sessions = dialogue_sessions(items[:limit] if limit is not None else items)
    for spec in bfcl:
        category, _, count = spec.partition(":")
        sessions += bfcl_sessions(category, int(count or 20))
    random.Random(seed).shuffle(sessions)
    return sessions


def stream_request(client: httpx.Client, url: str, payload: dict[str, Any], session: str,
                   mode: str, concurrency: int, tenant: str | None = None, key: str = ""
                   ) -> RequestRecord:
    """One streamed request: when its first content or tool-call fragment came, when it ended,
    its usage, what it said (content, calls) and the ``toolspec`` extension of its last
    chunk."""
    started = time.perf_counter()
    ttft, tokens, mat, status = None, 0, 0.0, 0
    prompt = cached = prompt_rows = decode_rows = 0
    content: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
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
                    content.append(delta.get("content") or "")
                    for fragment in delta.get("tool_calls") or ():
                        call = calls.setdefault(fragment.get("index", 0), ["", ""])
                        function = fragment.get("function") or {}
                        call[0] += function.get("name") or ""
                        call[1] += function.get("arguments") or ""
                    if choice.get("finish_reason"):
                        extension = chunk.get("toolspec", {})
                        mat = extension.get("mat", 0.0)
                        rows = extension.get("rows", {})
                        prompt_rows, decode_rows = rows.get("prompt", 0), rows.get("decode", 0)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    tokens, prompt = usage["completion_tokens"], usage["prompt_tokens"]
                    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    except httpx.HTTPError:
        status = 598
    tools = ",".join(sorted(t["function"]["name"] for t in payload.get("tools", ())))[:80]
    return RequestRecord(mode, concurrency, started, ttft, time.perf_counter() - started,
                         tokens, mat, status, prompt, cached, prompt_rows, decode_rows, tools,
                         key, "".join(content),
                         tuple((name, _arguments(text)) for name, text in calls.values()))


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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


def warm_up(url: str, model: str, sessions: list[dict[str, Any]], count: int, max_tokens: int,
            tenant: str) -> None:
    """``count`` requests one after another (the last sessions' turns), not measured."""
    turns = [(session, messages) for session in reversed(sessions)
             for messages in session["turns"]][:count]
    with httpx.Client() as client:
        for session, messages in turns:
            payload = {"model": model, "messages": messages, "tools": session["tools"],
                       "max_tokens": max_tokens, "stream": True, "temperature": 0}
            stream_request(client, url, payload, f"warmup-{uuid.uuid4().hex[:8]}", "warmup", 1,
                           tenant)


def summarize(records: list[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in records if r.status == 200]
    if not ok:
        return {"requests": len(records), "failed": len(records)}
    span = max(r.started + r.latency_s for r in ok) - min(r.started for r in ok)
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    latencies = sorted(r.latency_s for r in ok)
    inter = sorted(r.inter_token_s for r in ok if r.inter_token_s is not None)
    prompt_rows = sum(r.prompt_rows for r in ok)
    rows = prompt_rows + sum(r.decode_rows for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    # A tool set this level's tenant sent before: its system prompt and tools can be cached.
    seen: set[str] = set()
    repeated = []
    for record in sorted(ok, key=lambda r: r.started):
        if record.tools in seen and record.ttft_s is not None:
            repeated.append(record.ttft_s)
        seen.add(record.tools)
    return {
        "requests": len(records), "failed": len(records) - len(ok),
        "completion_tokens_per_s": sum(r.completion_tokens for r in ok) / span,
        "requests_per_s": len(ok) / span,
        "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p99_s": _quantile(ttfts, 0.99),
        "repeated_tools_ttft_p50_s": _quantile(sorted(repeated), 0.5),
        "latency_p50_s": _quantile(latencies, 0.5), "latency_p99_s": _quantile(latencies, 0.99),
        "inter_token_p50_s": _quantile(inter, 0.5), "inter_token_p99_s": _quantile(inter, 0.99),
        "mean_completion_tokens": statistics.mean(r.completion_tokens for r in ok),
        "mat": statistics.mean(r.mat for r in ok),
        "cached_prompt_share": sum(r.cached_tokens for r in ok) / prompt_tokens
        if prompt_tokens else 0.0,
        "prompt_row_share": prompt_rows / rows if rows else 0.0,
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def mode_config(document: dict[str, Any], draft_budget: int | str, replicas: int = 1,
                routing: str = "prefix_aware",
                prefix_cache_bytes: int | None = None) -> dict[str, Any]:
    """The serve config ``document`` as one mode deploys it: ``replicas`` fixed replicas routed
    by ``routing`` (and another prefix-cache size, if given), the ModelServer in plain mode
    (``draft_budget`` 0) or drafting. Mutates: ``document`` (returned)."""
    for app in document["applications"]:
        model_args = app.setdefault("args", {}).setdefault("model", {})
        model_args.pop("autoscaling", None)
        model_args.update(replicas=replicas, routing=routing)
        if prefix_cache_bytes is not None:
            model_args["prefix_cache_bytes"] = prefix_cache_bytes
        # Plain decoding: the own engine verifies no draft; vLLM's engine runs with no
        # speculative method (a reload: its speculation is fixed when the engine starts).
        if model_args.get("engine", "toolspec") == "vllm":
            method = model_args.get("speculative_method", "toolspec")
            mode = {"speculative_method": "none" if draft_budget == 0 else method}
        else:
            mode = {"draft_budget": draft_budget}
        for deployment in app.get("deployments", ()):
            if deployment.get("name") == "ModelServer":
                deployment.setdefault("user_config", {}).update(mode)
    return document


def switch_mode(config: Path, draft_budget: int | str, url: str, model: str,
                replicas: int = 1, routing: str = "prefix_aware",
                prefix_cache_bytes: int | None = None) -> None:
    """``serve deploy`` ``config`` as ``mode_config`` makes it, then wait until a request is
    answered in that mode (a deploy that changes nothing restarts nothing)."""
    document = mode_config(yaml.safe_load(config.read_text()), draft_budget, replicas, routing,
                           prefix_cache_bytes)
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

    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    (throughput, latency), (inter, rows) = axes
    for mode, style in (("toolspec", "o-"), ("plain", "s--")):
        level = levels.get(mode, {})
        counts = sorted(level)

        def series(key: str) -> list[float]:
            return [level[c].get(key) or 0 for c in counts]

        throughput.plot(counts, series("completion_tokens_per_s"), style, label=mode)
        latency.plot(counts, series("ttft_p99_s"), style, label=f"{mode} TTFT p99")
        latency.plot(counts, series("ttft_p50_s"), style, alpha=0.45, label=f"{mode} TTFT p50")
        inter.plot(counts, [1000 * v for v in series("inter_token_p99_s")], style,
                   label=f"{mode} p99")
        inter.plot(counts, [1000 * v for v in series("inter_token_p50_s")], style, alpha=0.45,
                   label=f"{mode} p50")
        rows.plot(counts, series("prompt_row_share"), style, label=f"{mode} prompt rows")
        rows.plot(counts, series("cached_prompt_share"), style, alpha=0.45,
                  label=f"{mode} prompt tokens cached")
    throughput.set(xscale="log", xlabel="concurrent sessions", ylabel="completion tokens / s",
                   title="throughput")
    latency.set(xscale="log", yscale="log", xlabel="concurrent sessions", ylabel="seconds",
                title="time to first token")
    inter.set(xscale="log", xlabel="concurrent sessions", ylabel="ms per token",
              title="inter-token latency (per request)")
    rows.set(xscale="log", xlabel="concurrent sessions", ylabel="share", ylim=(0, 1),
             title="prompt rows of forward rows; prompt tokens from the cache")
    for axis in axes.flat:
        axis.set_xticks(sorted({c for level in levels.values() for c in level}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def goals(levels: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The serving goals at 8 sessions against these figures (both modes with the prefix
    cache)."""
    ours, plain = levels.get("toolspec", {}), levels.get("plain", {})
    lines = []
    if 8 in ours:
        lines.append(f"toolspec prompt rows at 8: {ours[8]['prompt_row_share']:.1%} of forward "
                     f"rows (goal <= 20%); prompt tokens from the cache: "
                     f"{ours[8]['cached_prompt_share']:.1%}")
    if 1 in ours and 8 in ours:
        ratio = ours[8]["completion_tokens_per_s"] / ours[1]["completion_tokens_per_s"]
        lines.append(f"toolspec throughput at 8 / at 1: {ratio:.2f}x (goal >= 3.5x)")
        ttft = ours[8]["ttft_p99_s"] / ours[1]["ttft_p50_s"]
        lines.append(f"toolspec p99 TTFT at 8 / single-session median TTFT: {ttft:.2f}x "
                     f"(goal <= 3x)")
        if ours[8]["inter_token_p99_s"] and ours[1]["inter_token_p99_s"]:
            inter = ours[8]["inter_token_p99_s"] / ours[1]["inter_token_p99_s"]
            lines.append(f"toolspec inter-token latency p99 at 8 / at 1: {inter:.2f}x "
                         f"(goal <= 3x)")
    if 1 in ours and ours[1].get("repeated_tools_ttft_p50_s") is not None:
        lines.append(f"toolspec TTFT p50 of a repeated tool set at 1: "
                     f"{ours[1]['repeated_tools_ttft_p50_s']:.2f} s (goal <= 0.25 s)")
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
    parser.add_argument("--apibank", type=apibank_file, default="apibank:level-2",
                        help="API-Bank dialogues: apibank:level-1, apibank:level-2 or a JSON file")
    parser.add_argument("--apibank-skip", type=int, default=0,
                        help="leave out the first API-Bank items (a tuning part)")
    parser.add_argument("--bfcl", action="append", default=None,
                        help="CATEGORY:N BFCL items as one-turn sessions (default "
                             "simple_python:20 and multiple:20; 'none' for none)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="model replicas of the measured deployment (autoscaling off)")
    parser.add_argument("--routing", default="prefix_aware",
                        choices=("prefix_aware", "session_hash", "power_of_two"))
    parser.add_argument("--prefix-cache-bytes", type=int, default=None,
                        help="each replica's prefix cache (default: the config's)")
    parser.add_argument("--warmup", type=int, default=6,
                        help="requests sent (as a tenant of their own, not measured) once the "
                             "deployment is up: a fresh replica's first forwards of each shape "
                             "are slow")
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
    bfcl = [spec for spec in (args.bfcl or ["simple_python:20", "multiple:20"])
            if spec != "none"]
    sessions = load_sessions(args.apibank, bfcl, skip=args.apibank_skip)
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
                                args.model, args.replicas, args.routing,
                                args.prefix_cache_bytes)
                # The sessions repeat from level to level: a tenant of its own keeps what
                # ToolSpec's memory learned of their answers in one run from drafting another.
                if number == 0 and mode == (modes if number % 2 == 0 else modes[::-1])[0]:
                    warm_up(args.url, args.model, sessions, args.warmup, args.max_tokens,
                            f"warmup-{run_id}")
                tenant = None if args.shared_memory else f"load-{mode}-{level}-{run_id}"
                level_records = run_level(args.url, args.model, sessions, mode, level,
                                          args.seconds, args.max_tokens, tenant)
                records += level_records
                summary[mode][level] = summarize(level_records)
                print(f"{mode:>9} x{level:<3} {json.dumps(summary[mode][level])}", flush=True)
                (args.out / "results.json").write_text(json.dumps({
                    "url": args.url, "seconds_per_level": args.seconds,
                    "replicas": args.replicas, "routing": args.routing,
                    "prefix_cache_bytes": args.prefix_cache_bytes,
                    "apibank": str(args.apibank), "apibank_skip": args.apibank_skip,
                    "bfcl": bfcl,
                    "max_tokens": args.max_tokens, "sessions": len(sessions),
                    "levels": summary, "requests": [asdict(r) for r in records]}, indent=1))
    finally:
        if not args.no_switch and "plain" in modes:
            switch_mode(args.config, budget, args.url, args.model, args.replicas, args.routing,
                        args.prefix_cache_bytes)
    plot(summary, args.out / "concurrency.png")
    print("\n".join(goals(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
