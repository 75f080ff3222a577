"""GuideLLM, the standard load client, on our tool-calling requests against a running
deployment (loopback only; each level bounded by ``--seconds``).

``run`` writes every turn of the load script's sessions (API-Bank dialogues and BFCL items, the
same ``load_sessions`` as ``load_tests/concurrency.py``) as one JSON line ``{"messages": [...],
"tools": [...], "tool_choice": "auto"}`` — the columns GuideLLM's ``generative_column_mapper``
sends as a chat completion's messages, tools and tool choice (GuideLLM would force
``required`` otherwise; our load script sends ``auto``) — then runs GuideLLM's concurrent
profile once per level, each level a cold tenant of its own (the tenant header), as our load
script does, and writes the figures (throughput, TTFT and inter-token latency p50/p99) as
``summary.json`` and ``summary.md``. Runs in the main venv (``make guidellm`` calls it);
GuideLLM itself runs in its own venv (``.venv-guidellm``), as Locust does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "load_tests"))
from concurrency import load_sessions  # noqa: E402

from deployments.http.tenants import TENANT_HEADER  # noqa: E402
from toolspec.bench.datasets import apibank_file  # noqa: E402
from toolspec.model.packages import REGISTRY, converted_dir  # noqa: E402


def write(out: Path, apibank: Path, bfcl: list[str], skip: int) -> int:
    """One request per session turn; returns how many. Mutates: writes ``out``."""
    rows = [{"messages": turn, "tools": session["tools"], "tool_choice": "auto"}
            for session in load_sessions(apibank, bfcl, skip=skip)
            for turn in session["turns"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return len(rows)


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per benchmark (one concurrency level): the figures our load script reports too."""
    rows = []
    for benchmark in report["benchmarks"]:
        metrics = benchmark["metrics"]
        strategy = benchmark["config"]["strategy"]

        def stat(name: str, field: str, scale: float = 1.0) -> float | None:
            values = metrics.get(name, {}).get("successful") or {}
            value = values.get(field) if field in values else (values.get("percentiles") or
                                                                {}).get(field)
            return None if value is None else value * scale

        totals = benchmark["scheduler_metrics"]["requests_made"] \
            if "scheduler_metrics" in benchmark else {}
        rows.append({
            "streams": strategy.get("streams"),
            "output_tokens_per_s": stat("output_tokens_per_second", "mean"),
            "requests_per_s": stat("requests_per_second", "mean"),
            "ttft_p50_ms": stat("time_to_first_token_ms", "p50"),
            "ttft_p99_ms": stat("time_to_first_token_ms", "p99"),
            "itl_p50_ms": stat("inter_token_latency_ms", "p50"),
            "itl_p99_ms": stat("inter_token_latency_ms", "p99"),
            "requests": totals.get("successful"),
            "errors": totals.get("errored"),
        })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any, digits: int = 1) -> str:
        return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) \
            else str(value)

    lines = ["| streams | output tok/s | req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | "
             "requests | errored (no tool call) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {cell(row['streams'])} | {cell(row['output_tokens_per_s'])} | "
                     f"{cell(row['requests_per_s'], 2)} | {cell(row['ttft_p50_ms'], 0)} / "
                     f"{cell(row['ttft_p99_ms'], 0)} | {cell(row['itl_p50_ms'], 0)} / "
                     f"{cell(row['itl_p99_ms'], 0)} | {cell(row['requests'])} | "
                     f"{cell(row['errors'])} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Every level, a cold tenant each, then the summary. Mutates: writes under ``args.out``."""
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("GuideLLM runs against a loopback deployment only")
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "requests.jsonl"
    bfcl = args.bfcl if args.bfcl is not None else ["simple_python:20", "multiple:20"]
    print(f"{write(data, args.apibank, bfcl, args.apibank_skip)} requests -> {data}")
    tokenizer = str(converted_dir(REGISTRY[args.model])) if args.model in REGISTRY \
        else args.model
    stamp = time.strftime("%H%M%S")
    rows = []
    for level in args.levels:
        report = args.out / f"streams-{level}.json"
        scenario = {"spec": {
            "backend": {"kind": "openai_http", "target": args.url, "model": args.model,
                        "request_format": "/v1/chat/completions",
                        "extras": {"headers": {TENANT_HEADER: f"guidellm-{stamp}-{level}"}}},
            "data": [{"kind": "json_file", "path": str(data.resolve())}],
            "tokenizer": {"kind": "hf_auto", "model": tokenizer},
            "profile": {"kind": "concurrent", "streams": [level]},
            "constraints": [{"kind": "max_duration", "seconds": args.seconds}],
            "outputs": [{"kind": "json", "path": str(report.resolve())}]}}
        config = args.out / f"scenario-{level}.json"
        config.write_text(json.dumps(scenario, indent=2))
        subprocess.run([str(args.guidellm), "run", "-c", str(config),
                        "--disable-console-interactive"], check=True,
                       timeout=args.seconds * 4 + 300)
        rows += summarize(json.loads(report.read_text()))
    table = markdown(rows)
    (args.out / "summary.md").write_text(table + "\n")
    (args.out / "summary.json").write_text(json.dumps(
        {"url": args.url, "model": args.model, "seconds": args.seconds, "levels": rows},
        indent=2))
    print(table)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--guidellm", type=Path, default=ROOT / ".venv-guidellm/bin/guidellm")
    parser.add_argument("--levels", type=lambda text: [int(n) for n in text.split(",")],
                        default=[1, 2, 4, 8, 16], help="concurrent streams, e.g. 1,2,4,8,16")
    parser.add_argument("--seconds", type=float, default=90.0, help="per level")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "guidellm")
    parser.add_argument("--apibank", type=apibank_file, default="apibank:level-2",
                        help="API-Bank dialogues: apibank:level-1, apibank:level-2 or a file")
    parser.add_argument("--apibank-skip", type=int, default=0)
    parser.add_argument("--bfcl", action="append", default=None,
                        help="CATEGORY:N (default simple_python:20 and multiple:20)")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
