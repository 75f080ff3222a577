"""Every engine in one run: this deployment (the project's own engine, and vLLM's engine with the
ToolSpec proposer) against the engine users already run — vLLM's own OpenAI server plain, with
n-gram prompt lookup and with SuffixDecoding (Arctic Inference; K swept) — on the same machine,
the same requests, one compute thread each, every level cold.

Traffic: the project's agent traffic (``load_tests/sessions.py``): API-Bank level-1 dialogues from
item ``--apibank-skip`` on and BFCL items, in OpenAI ``tools`` form, streamed, greedy, turns as the
data gives them (so every engine gets the very same requests, in the same order). Per concurrency
level N, N clients take the next session of one fixed list and send its turns in order with its
own ``x-session-id``, for ``--seconds`` (requests in flight then finish): throughput is measured
under a full load, not a draining one; the requests every engine completed are compared.

Cold: vLLM's server starts afresh for each level (its prefix cache and SuffixDecoding's response
cache start empty); this deployment starts once per engine and serves each level as a tenant of
its own (its prefix cache is salted, its call library and draft memory kept, per tenant).

Per engine and level: completion tokens/s, TTFT and inter-token latency p50/p99, accepted tokens
per step (this deployment: each response's ``toolspec.mat``; vLLM's server: its Prometheus
counters, 1 + accepted / drafts), and the share of answers equal to vLLM plain's (the same calls,
or the same text). ``--out``: ``results.json``, ``peer.png``, ``peer.md``. Everything runs on
127.0.0.1 and stops by itself; nothing else of ours may run meanwhile.

    .venv/bin/python load_tests/peer_bench.py --out results/peer        # make peer-bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from toolspec.bench.datasets import apibank_file
from toolspec.calls.formats import get_format
from toolspec.calls.output import OutputParse
from toolspec.model.packages import DEFAULT_MODEL, resolve_model_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "load_tests"))
from concurrency import RequestRecord, load_sessions, stream_request, summarize  # noqa: E402
from local_ray import cli, free_port, ray_head  # noqa: E402

READY_TIMEOUT_S = 1200  # a first start converts the weights and compiles vLLM's graph


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the comparison: this deployment with ``model`` settings, or vLLM's server
    with ``speculative`` (None: plain)."""

    name: str
    kind: str  # "deployment" | "vllm-server"
    model: dict[str, Any] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    server_args: tuple[str, ...] = ()  # more of vLLM's server flags


def engines(suffix_tokens: list[int], toolspec_tokens: list[int], ngram_tokens: int,
            step_caps: Sequence[int] = ()) -> list[EngineSpec]:
    # vLLM's CPU default KV block is 128 tokens; this deployment uses 32 (more of a tool list
    # found in the prefix cache): the -b32 servers show what that alone gives vLLM.
    b32 = ("--block-size", "32")
    specs = [EngineSpec("vllm", "vllm-server"), EngineSpec("vllm-b32", "vllm-server",
                                                           server_args=b32)]
    specs += [EngineSpec(f"toolspec-vllm-k{k}", "deployment",
                         {"engine": "vllm", "speculative_method": "toolspec",
                          "speculative_tokens": k}) for k in toolspec_tokens]
    # Without the per-step cap on draft tokens (the shipped setting caps them at 32).
    specs += [EngineSpec(f"toolspec-vllm-k{k}-uncapped", "deployment",
                         {"engine": "vllm", "speculative_method": "toolspec",
                          "speculative_tokens": k, "step_draft_tokens": None})
              for k in toolspec_tokens]
    # Other per-step caps (the shipped one is 32), to tune it.
    specs += [EngineSpec(f"toolspec-vllm-k{k}-cap{cap}", "deployment",
                         {"engine": "vllm", "speculative_method": "toolspec",
                          "speculative_tokens": k, "step_draft_tokens": cap})
              for k in toolspec_tokens for cap in step_caps]
    # vLLM without drafts behind this deployment: what its serving path (ingress, Ray hop,
    # call parsing) costs against vLLM's own server.
    specs.append(EngineSpec("deployment-vllm-plain", "deployment",
                            {"engine": "vllm", "speculative_method": "none"}))
    specs.append(EngineSpec("toolspec", "deployment", {"engine": "toolspec"}))
    specs += [EngineSpec(f"vllm-suffix-k{k}", "vllm-server",
                         speculative={"method": "suffix", "num_speculative_tokens": k})
              for k in suffix_tokens]
    specs += [EngineSpec(f"vllm-suffix-k{k}-b32", "vllm-server", speculative={
        "method": "suffix", "num_speculative_tokens": k}, server_args=b32)
        for k in suffix_tokens]
    specs.append(EngineSpec(f"vllm-ngram-k{ngram_tokens}", "vllm-server", speculative={
        "method": "ngram", "num_speculative_tokens": ngram_tokens, "prompt_lookup_min": 2,
        "prompt_lookup_max": 5}))
    return specs


# ---- the requests -------------------------------------------------------------------------------

def run_level(url: str, model: str, sessions: list[dict[str, Any]], name: str, level: int,
              max_tokens: int, tenant: str | None, salt: str | None = None,
              seconds: float | None = None) -> list[RequestRecord]:
    """``level`` clients taking ``sessions`` in order (each turn by turn) until ``seconds``
    have passed (None: until none are left); as ``tenant`` (this deployment) or with vLLM's
    ``cache_salt`` ``salt`` (its server)."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    queue = iter(sessions)
    deadline = time.perf_counter() + seconds if seconds is not None else None

    def client() -> None:
        with httpx.Client() as http:
            while deadline is None or time.perf_counter() < deadline:
                with lock:
                    session = next(queue, None)
                if session is None:
                    return
                session_id = f"{session['id']}-{uuid.uuid4().hex[:8]}"
                for turn, messages in enumerate(session["turns"]):
                    payload = {"model": model, "messages": messages, "tools": session["tools"],
                               "max_tokens": max_tokens, "stream": True, "temperature": 0,
                               "stream_options": {"include_usage": True}}
                    if salt is not None:
                        payload["cache_salt"] = salt
                    record = stream_request(http, url, payload, session_id, name, level, tenant,
                                            key=f"{session['id']}#{turn}")
                    with lock:
                        records.append(record)

    threads = [threading.Thread(target=client) for _ in range(level)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join()
    return records


def answer(record: RequestRecord) -> str:
    """What a response said, comparable across servers (``comparable``): its calls as this
    deployment streamed them, else its text (vLLM's server leaves this model's calls in it)."""
    return comparable(json.dumps(record.calls) if record.calls else record.output)


def comparable(said: str) -> str:
    """An answer in one form whichever server gave it: calls (a JSON list of [name, arguments])
    as they are, or else the calls the project's streaming call parser finds in the text, as
    this deployment would have streamed them (a call cut off at ``max_tokens`` included, its
    arguments the text written so far); arguments parsed where they are JSON. Text without
    calls stays text."""
    try:
        calls = json.loads(said)
    except ValueError:
        calls = None
    if not (isinstance(calls, list) and calls
            and all(isinstance(c, list) and len(c) == 2 for c in calls)):
        parse = OutputParse(get_format("hermes"))
        parse.feed(said)
        calls = [[span.name, span.arguments(parse.text)] for span in parse.spans if span.name]
        if not calls:
            return said.strip()
    return json.dumps([[name, _json_or_text(arguments)] for name, arguments in calls],
                      sort_keys=True)


def _json_or_text(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


# ---- the servers --------------------------------------------------------------------------------

def _wait(url: str, process: subprocess.Popen | None, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited while starting:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} never answered; see {log}")


@contextmanager
def vllm_server(spec: EngineSpec, model: str, threads: str, kv_cache_gib: float, log: Path,
                gpu: bool = False, eager: bool = False):
    """vLLM's OpenAI server as users start it, on its own port (on the CPU, one compute
    thread and ``kv_cache_gib`` of KV cache)."""
    port = free_port()
    memory = ["--gpu-memory-utilization", "0.85"] if gpu else [
        "--kv-cache-memory-bytes", str(int(kv_cache_gib * (1 << 30)))]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(resolve_model_dir(model)), "--served-model-name", model,
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
               "--enable-prefix-caching", *memory,
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    if spec.speculative is not None:
        command += ["--speculative-config", json.dumps(spec.speculative)]
    command += spec.server_args
    if eager:
        command.append("--enforce-eager")
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": threads}
    with open(log, "a") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def spec_counters(url: str) -> tuple[float, float]:
    """vLLM's speculative-decoding counters: accepted draft tokens, drafts (verify steps)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0.0, 0.0

    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^vllm:{name}(?:{{[^}}]*}})? (\S+)$", text,
                                               re.MULTILINE))

    return total("spec_decode_num_accepted_tokens_total"), total("spec_decode_num_drafts_total")


@contextmanager
def deployment(spec: EngineSpec, threads: str, kv_cache_gib: float, work: Path,
               gpu: bool = False, eager: bool = False, worker_niceness: int = 0):
    """This deployment (``serve_config.yaml`` with ``spec``'s model settings, one replica
    (on the GPU with ``gpu``), the library in ``work``) on a Ray head of its own, whose
    workers run at ``worker_niceness``."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    http_port = free_port()
    config["http_options"]["port"] = http_port
    (application,) = config["applications"]
    model = application["args"]["model"]
    model.pop("autoscaling", None)
    model.update(replicas=1, cpu_threads=threads, kv_cache_gib=kv_cache_gib, **spec.model)
    if gpu:
        model["num_gpus"] = 1
    if eager:
        model["compile"] = False
    application["args"]["library"]["path"] = str(work / "library")
    for entry in application.get("deployments", ()):
        if entry.get("name") == "ModelServer":
            entry.get("user_config", {}).pop("draft_budget", None)
            entry.setdefault("user_config", {}).update(
                {key: value for key, value in spec.model.items() if key != "engine"})
    path = work / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{http_port}"
    with ray_head(work, worker_niceness=worker_niceness) as head:
        serve = cli("serve")
        subprocess.run([serve, "deploy", "--address", head.dashboard, str(path)], env=head.env,
                       check=True, timeout=300, capture_output=True)
        try:
            _wait(url, None, work / "serve.log")
            yield url
        finally:
            subprocess.run([serve, "shutdown", "--address", head.dashboard, "--yes"],
                           env=head.env, check=False, timeout=300, capture_output=True)


# ---- one run ------------------------------------------------------------------------------------

def measure(spec: EngineSpec, args: argparse.Namespace, sessions: list[dict[str, Any]],
            levels: list[int], run_id: str, out: Path) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}

    def one_level(url: str, level: int, tenant: str | None, salt: str | None = None) -> None:
        # Not measured: the first forwards of each shape are slow; another tenant's requests
        # (and, for vLLM's server, before the counters are read) so nothing measured is warm.
        run_level(url, args.model, sessions[-args.warmup:], "warmup", 1, args.max_tokens,
                  f"warmup-{run_id}-{level}", f"warmup-{run_id}-{level}" if salt else None)
        before = spec_counters(url)
        records = run_level(url, args.model, sessions[:-args.warmup], spec.name, level,
                            args.max_tokens, tenant, salt, args.seconds)
        after = spec_counters(url)
        summary = summarize(records)
        if spec.kind == "vllm-server" and spec.speculative is not None:
            drafts = after[1] - before[1]
            summary["mat"] = 1 + (after[0] - before[0]) / drafts if drafts else 1.0
        elif spec.kind == "vllm-server":
            summary["mat"] = 1.0
        summary["answers"] = {r.key: answer(r) for r in records if r.status == 200}
        summary["ttft_by_request"] = {r.key: r.ttft_s for r in records
                                      if r.status == 200 and r.ttft_s is not None}
        results[level] = summary
        print(f"{spec.name:>22} x{level:<3} " + json.dumps(
            {k: v for k, v in summary.items() if k != "answers"}), flush=True)

    log = out / f"{spec.name}.log"
    if spec.kind == "vllm-server" and args.one_start:
        # One start for every level (where starts are dear): the prefix cache is salted per
        # level; SuffixDecoding's response cache is not, so later levels find it warm.
        with vllm_server(spec, args.model, args.threads, args.kv_cache_gib, log,
                         args.gpu, args.eager) as url:
            for level in levels:
                one_level(url, level, None, f"peer-{level}-{run_id}")
    elif spec.kind == "vllm-server":
        for level in levels:  # a fresh server per level: nothing learnt earlier serves it
            with vllm_server(spec, args.model, args.threads, args.kv_cache_gib, log,
                             args.gpu, args.eager) as url:
                one_level(url, level, None)
    else:
        with tempfile.TemporaryDirectory(prefix=f"peer-{spec.name}-") as work, \
                deployment(spec, args.threads, args.kv_cache_gib, Path(work), args.gpu,
                           args.eager, args.ray_worker_niceness) as url:
            for level in levels:
                one_level(url, level, f"peer-{spec.name}-{level}-{run_id}")
    return results


def compare(results: dict[str, dict[int, dict[str, Any]]], reference: str = "vllm"
            ) -> dict[str, dict[str, Any]]:
    """Per engine: the share of its answers equal to ``reference``'s for the same request,
    and the requests that differ (first 20)."""
    report: dict[str, dict[str, Any]] = {}
    for name, levels in results.items():
        same = total = 0
        different: list[dict[str, Any]] = []
        for level, summary in levels.items():
            expected = results.get(reference, {}).get(level, {}).get("answers", {})
            for key, text in summary.get("answers", {}).items():
                if key not in expected:
                    continue
                total += 1
                if comparable(text) == comparable(expected[key]):
                    same += 1
                elif len(different) < 20:
                    different.append({"level": level, "request": key, "answer": text[:300],
                                      reference: expected[key][:300]})
        report[name] = {"identical": same, "compared": total, "different": different}
    return report


def path_overhead(results: dict[str, dict[int, dict[str, Any]]],
                  ours: str = "deployment-vllm-plain") -> list[str]:
    """What this deployment's serving path adds to the time to first token, request by
    request: ``ours`` (vLLM without drafts behind the deployment) against the best plain vLLM
    server on the same requests, apart for answers that are tool calls (whose first fragment
    waits for the call's complete name, as OpenAI's stream does) and answers that are text."""
    lines = []
    for level, mine in sorted(results.get(ours, {}).items()):
        plain = best_plain(results, level)
        theirs = results[plain][level] if plain else {}
        differences: dict[bool, list[float]] = {True: [], False: []}
        for key, seconds in mine.get("ttft_by_request", {}).items():
            other = theirs.get("ttft_by_request", {}).get(key)
            if other is not None:
                is_call = comparable(mine["answers"].get(key, "")).startswith("[[")
                differences[is_call].append(seconds - other)
        for is_call, kind in ((False, "text answers"), (True, "tool-call answers")):
            found = sorted(differences[is_call])
            if found:
                lines.append(f"{level} session(s), {kind}: TTFT {ours} - {plain} median "
                             f"{found[len(found) // 2]:+.3f} s over {len(found)} requests")
    return lines


def best_of(results: dict[str, dict[int, dict[str, Any]]], prefix: str, level: int) -> str | None:
    """The engine named ``prefix``... with the most tokens/s at ``level``."""
    names = [n for n in results if n.startswith(prefix) and level in results[n]]
    return max(names, key=lambda n: results[n][level].get("completion_tokens_per_s", 0),
               default=None)


def table(results: dict[str, dict[int, dict[str, Any]]], identity: dict[str, dict[str, Any]],
          levels: list[int]) -> str:
    rows = ["| engine | sessions | tokens/s | TTFT p50 s | TTFT p99 s | ITL p50 ms | "
            "ITL p99 ms | tokens per step | same answer as vLLM plain |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, by_level in results.items():
        same = identity.get(name, {})
        share = f"{same['identical']}/{same['compared']}" if same.get("compared") else "–"
        for level in levels:
            s = by_level.get(level)
            if not s or "completion_tokens_per_s" not in s:
                continue
            rows.append(
                f"| {name} | {level} | {s['completion_tokens_per_s']:.1f} | "
                f"{s['ttft_p50_s']:.2f} | {s['ttft_p99_s']:.2f} | "
                f"{1000 * (s['inter_token_p50_s'] or 0):.0f} | "
                f"{1000 * (s['inter_token_p99_s'] or 0):.0f} | {s['mat']:.2f} | {share} |")
    return "\n".join(rows)


def goals(results: dict[str, dict[int, dict[str, Any]]], ours: str) -> list[str]:
    """Issue 50's goals for engine ``ours`` against the best SuffixDecoding and vLLM plain."""
    lines = []
    for level, versus_suffix, versus_plain in ((1, 1.5, 3.0), (8, 1.3, 1.5)):
        mine = results.get(ours, {}).get(level, {}).get("completion_tokens_per_s")
        suffix = best_of(results, "vllm-suffix", level)
        plain = best_plain(results, level)
        if mine and suffix:
            ratio = mine / results[suffix][level]["completion_tokens_per_s"]
            lines.append(f"{level} session(s): {ours} {ratio:.2f}x {suffix} (goal >= "
                         f"{versus_suffix}x)")
        if mine and plain:
            ratio = mine / results[plain][level]["completion_tokens_per_s"]
            lines.append(f"{level} session(s): {ours} {ratio:.2f}x {plain} (goal >= "
                         f"{versus_plain}x)")
    mine = results.get(ours, {})
    for level, quantile, goal in ((8, "ttft_p99_s", 1.25), (1, "ttft_p50_s", 1.10)):
        plain = best_plain(results, level)
        if level in mine and plain:
            ratio = mine[level][quantile] / results[plain][level][quantile]
            lines.append(f"TTFT {quantile[5:8]} at {level}: {ratio:.2f}x {plain}'s "
                         f"(goal <= {goal:.2f}x)")
    return lines


def best_plain(results: dict[str, dict[int, dict[str, Any]]], level: int) -> str | None:
    """vLLM plain at its best at ``level``: its default KV block or this deployment's (32)."""
    names = [n for n in ("vllm", "vllm-b32") if level in results.get(n, {})]
    return max(names, key=lambda n: results[n][level].get("completion_tokens_per_s", 0),
               default=None)


def plot(results: dict[str, dict[int, dict[str, Any]]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, ttft, inter) = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, by_level in results.items():
        levels = sorted(level for level in by_level if "completion_tokens_per_s" in by_level[level])
        style = "o-" if name.startswith("toolspec") else "s--"
        throughput.plot(levels, [by_level[n]["completion_tokens_per_s"] for n in levels], style,
                        label=name)
        ttft.plot(levels, [by_level[n]["ttft_p99_s"] for n in levels], style, label=name)
        inter.plot(levels, [1000 * (by_level[n]["inter_token_p50_s"] or 0) for n in levels],
                   style, label=name)
    throughput.set(xscale="log", xlabel="concurrent sessions", ylabel="completion tokens / s",
                   title="throughput")
    ttft.set(xscale="log", yscale="log", xlabel="concurrent sessions", ylabel="seconds",
             title="time to first token, p99")
    inter.set(xscale="log", xlabel="concurrent sessions", ylabel="ms per token",
              title="inter-token latency, p50")
    for axis in (throughput, ttft, inter):
        axis.set_xticks(sorted({n for by_level in results.values() for n in by_level}))
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.grid(alpha=0.3)
    throughput.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--engines", default=None,
                        help="comma-separated names to run (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="print the engines and stop")
    parser.add_argument("--report", action="store_true",
                        help="measure nothing: the comparison, table and plot again from "
                             "--out's results.json")
    parser.add_argument("--suffix-tokens", default="8,16,32",
                        help="SuffixDecoding's K values (the best is its figure)")
    parser.add_argument("--toolspec-tokens", default="16",
                        help="the ToolSpec proposer's K values on vLLM's engine")
    parser.add_argument("--ngram-tokens", type=int, default=5)
    parser.add_argument("--step-caps", default="",
                        help="per-step draft-token caps to add as engines "
                        "(toolspec-vllm-kK-capC), to tune step_draft_tokens")
    parser.add_argument("--seconds", type=float, default=90.0,
                        help="per engine and level (requests in flight then finish)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3, help="sessions sent first, unmeasured")
    parser.add_argument("--threads", default="0",
                        help="the core(s) each engine computes on (VLLM_CPU_OMP_THREADS_BIND)")
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--apibank", type=apibank_file, default="apibank:level-1")
    parser.add_argument("--apibank-skip", type=int, default=200,
                        help="API-Bank items before this were used for tuning")
    parser.add_argument("--apibank-limit", type=int, default=None,
                        help="API-Bank items at most (from --apibank-skip)")
    parser.add_argument("--bfcl", action="append", default=None,
                        help="CATEGORY:N BFCL one-turn sessions (default live_simple:16)")
    parser.add_argument("--one-start", action="store_true",
                        help="start each vLLM server once for every level (cache_salt per "
                             "level) instead of once per level")
    parser.add_argument("--gpu", action="store_true", help="engines on the GPU")
    parser.add_argument("--eager", action="store_true",
                        help="no graph compilation in any engine (quick starts, slower steps)")
    parser.add_argument("--ray-worker-niceness", type=int, default=0,
                        help="niceness of the deployment's Ray workers (its replicas and "
                        "engine processes): 0 as `make serve` starts them; 15 is Ray's default")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "peer")
    args = parser.parse_args()
    specs = engines([int(k) for k in args.suffix_tokens.split(",")],
                    [int(k) for k in args.toolspec_tokens.split(",")], args.ngram_tokens,
                    [int(cap) for cap in args.step_caps.split(",") if cap])
    if args.list:
        print("\n".join(f"{spec.name}: {spec.kind} {spec.model or spec.speculative or ''}"
                        for spec in specs))
        return 0
    if args.engines:
        wanted = args.engines.split(",")
        specs = [spec for spec in specs if spec.name in wanted]
    levels = [int(level) for level in args.levels.split(",")]
    bfcl = args.bfcl or ["live_simple:16"]
    sessions = load_sessions(args.apibank, [s for s in bfcl if s != "none"],
                             skip=args.apibank_skip, limit=args.apibank_limit)
    args.out.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, dict[int, dict[str, Any]]] = {}
    saved = args.out / "results.json"
    specs_run: list[dict[str, Any]] = []
    if saved.exists():  # a rerun adds engines to the same run's results
        earlier = json.loads(saved.read_text())
        results = {name: {int(k): v for k, v in by_level.items()}
                   for name, by_level in earlier["engines"].items()}
        specs_run = [s for s in earlier.get("specs", []) if s["name"] in results]
    for spec in (() if args.report else specs):
        specs_run = [s for s in specs_run if s["name"] != spec.name] + [asdict(spec)]
        results[spec.name] = measure(spec, args, sessions, levels, run_id, args.out)
        identity = compare(results)
        saved.write_text(json.dumps({
            "model": args.model, "levels": levels, "max_tokens": args.max_tokens,
            "threads": args.threads, "ray_worker_niceness": args.ray_worker_niceness,
            "apibank": str(args.apibank), "apibank_skip": args.apibank_skip, "bfcl": bfcl,
            "sessions": len(sessions),
            "specs": specs_run, "identity": identity,
            "engines": results}, indent=1))
    identity = compare(results)
    if args.report and saved.exists():  # the comparison as this code reads the answers
        document = json.loads(saved.read_text())
        saved.write_text(json.dumps({**document, "identity": identity}, indent=1))
        levels = document["levels"]
    report = [table(results, identity, levels), ""]
    best = max((n for n in results if n.startswith("toolspec")),
               key=lambda n: results[n].get(8, {}).get("completion_tokens_per_s", 0),
               default=None)
    if best is not None:
        report += [f"Goals for {best}:", *(f"- {line}" for line in goals(results, best))]
    overhead = path_overhead(results)
    if overhead:
        report += ["", "This deployment's path, time to first token:",
                   *(f"- {line}" for line in overhead)]
    (args.out / "peer.md").write_text("\n".join(report) + "\n")
    plot(results, args.out / "peer.png")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
