"""Where a batched step's time goes, and where a cold request's time to first token goes.

1. **A 16-session step.** Sixteen tool-calling requests are prefilled, then ``--steps``
   decoding steps of all sixteen together (``Engine.step``, ToolSpec drafting, the cost-aware
   budget) run under ``torch.profiler``. Each step's wall time is split into drafting
   (``propose``), the budget's choice, the forward, and the walk/commit/observe after it
   (``advance``); the forward into linear layers (and the LM head), the attention kernels
   (SDPA), the KV cache appends, the per-sequence Python loop of the ragged attention (the
   attention function's time less the kernels and appends inside it), and the rest (norms,
   rotary embeddings, activations, embedding).
2. **A cold request's time to first token**, in process, stage by stage: the chat template
   and tokenizer (what the ingress does), ``ChatEngine.open`` (drafter, grammar), the steps
   until the first token (prefix-cache lookup, prefill forward with its first tree), and the
   same request again with its prompt in the prefix cache.

    .venv/bin/python scripts/profile_step.py --data bfcl:multiple --sessions 16 --steps 12

A diagnostic: it prints a table and writes ``--json``; nothing of it is served.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from toolspec.bench.datasets import load_dataset
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.core.prefix_cache import PrefixCache
from toolspec.model import attention as grouped_attention
from toolspec.model.loading import load_model
from toolspec.model.packages import DEFAULT_MODEL
from toolspec.registry import DrafterFactory, build_engine

# Operator names by part of the forward (CPU kernels, fp32 and bf16, packed or not).
LINEAR = ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "mkldnn", "onednn",
          "packed", "aten::bmm")
SDPA = ("scaled_dot_product", "flash_attention", "_efficient_attention")
APPEND = ("aten::cat",)


def wrap_attention() -> None:
    """Label the ragged attention function's calls (``record_function``) so its own time can
    be told apart from the kernels it calls. Mutates: ``grouped_attention.ragged_attention``
    for this process (the registered attention functions look it up at call time)."""
    inner = grouped_attention.ragged_attention

    def labelled(*args: Any, **kwargs: Any) -> Any:
        with record_function("toolspec::ragged_attention"):
            return inner(*args, **kwargs)

    grouped_attention.ragged_attention = labelled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--data", default="bfcl:multiple")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a replica: 1)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.dtype)
    engine = build_engine(loaded, step_rows=0)
    engine.prefix_cache = PrefixCache(engine.model, 1 << 30, engine.block_tokens)
    drafters = DrafterFactory("toolspec-schema", loaded.tokenizer)
    items = load_dataset(args.data, args.sessions + 1)
    report: dict[str, Any] = {"model": loaded.name, "dtype": str(loaded.dtype),
                              "threads": args.threads, "data": args.data}
    report["step"] = profile_step(engine, drafters, loaded.tokenizer, items[:args.sessions],
                                  args.steps)
    report["ttft"] = profile_ttft(loaded, engine, drafters, items[args.sessions])
    print(json.dumps(report, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def start_jobs(engine: Any, drafters: DrafterFactory, tokenizer: Any, items: list[Any],
               tenant: str) -> list[Any]:
    jobs = []
    for item in items:
        prompt, call_format = chat_prompt(tokenizer, item.messages, item.openai_tools)
        jobs.append(engine.start(prompt, drafters.for_request(tenant, item.tools is not None),
                                 tools=item.tools, call_format=call_format,
                                 conversation=conversation_text(item.messages), tenant=tenant))
    return jobs


def profile_step(engine: Any, drafters: DrafterFactory, tokenizer: Any, items: list[Any],
                 steps: int) -> dict[str, Any]:
    """Prefill ``items`` together, then profile ``steps`` steps of all of them decoding."""
    jobs = start_jobs(engine, drafters, tokenizer, items, "profile")
    while any(job.prefilling for job in jobs if not job.done):
        engine.step([job for job in jobs if not job.done])
    phases: dict[str, float] = defaultdict(float)
    wrap_attention()
    live_counts = []
    originals = {name: getattr(type(jobs[0]), name) for name in ("propose", "advance")}

    def timed(name: str) -> Any:
        method = originals[name]

        def run(job: Any, *a: Any, **k: Any) -> Any:
            clock = time.perf_counter()
            with record_function(f"toolspec::{name}"):
                result = method(job, *a, **k)
            phases[name] += time.perf_counter() - clock
            return result
        return run

    for name in originals:
        setattr(type(jobs[0]), name, timed(name))
    forward = engine.model.forward

    def timed_forward(batch: Any) -> Any:
        clock = time.perf_counter()
        with record_function("toolspec::forward"):
            result = forward(batch)
        phases["forward"] += time.perf_counter() - clock
        return result

    engine.model.forward = timed_forward
    select = engine.budget.select_batch

    def timed_select(trees: Any) -> Any:
        clock = time.perf_counter()
        result = select(trees)
        phases["budget"] += time.perf_counter() - clock
        return result

    engine.budget.select_batch = timed_select
    wall = 0.0
    try:
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                live = [job for job in jobs if not job.done]
                if not live:
                    break
                live_counts.append(len(live))
                clock = time.perf_counter()
                engine.step(live)
                wall += time.perf_counter() - clock
    finally:
        for name, method in originals.items():
            setattr(type(jobs[0]), name, method)
        for job in jobs:
            job.close()
    kernels = kernel_times(profiler)
    forward_s = phases["forward"]
    loop_s = max(0.0, kernels["ragged_attention"] - kernels["sdpa"] - kernels["append"])
    parts = {
        "drafting (propose)": phases["propose"],
        "budget": phases["budget"],
        "forward: linear layers + LM head": kernels["linear"],
        "forward: attention kernels (SDPA)": kernels["sdpa"],
        "forward: KV cache appends": kernels["append"],
        "forward: per-sequence loop in attention": loop_s,
        "forward: the rest (norms, rotary, activations, embedding)":
            max(0.0, forward_s - kernels["linear"] - kernels["sdpa"] - kernels["append"]
                - loop_s),
        "walk, commit, observe (advance)": phases["advance"],
    }
    parts["scheduling and the rest of the step"] = max(0.0, wall - sum(parts.values()))
    steps_run = len(live_counts)
    table = {name: {"ms_per_step": 1000 * seconds / steps_run,
                    "share": seconds / wall if wall else 0.0}
             for name, seconds in parts.items()}
    print(f"\n{steps_run} steps of {live_counts[0]} sessions: {1000 * wall / steps_run:.0f} ms "
          f"a step")
    for name, row in table.items():
        print(f"  {name:<58} {row['ms_per_step']:8.1f} ms  {row['share']:6.1%}")
    return {"sessions": live_counts[0], "steps": steps_run, "ms_per_step": 1000 * wall /
            steps_run, "parts": table}


def kernel_times(profiler: Any) -> dict[str, float]:
    """Seconds of CPU time by kind of operator (self time, so nothing counts twice), and the
    labelled attention function's total."""
    times = {"linear": 0.0, "sdpa": 0.0, "append": 0.0, "ragged_attention": 0.0}
    for event in profiler.key_averages():
        name = event.key.lower()
        seconds = event.self_cpu_time_total / 1e6
        if event.key == "toolspec::ragged_attention":
            times["ragged_attention"] = event.cpu_time_total / 1e6
        elif any(marker in name for marker in SDPA):
            times["sdpa"] += seconds
        elif any(marker in name for marker in LINEAR):
            times["linear"] += seconds
        elif any(marker in name for marker in APPEND):
            times["append"] += seconds
    return times


def profile_ttft(loaded: Any, engine: Any, drafters: DrafterFactory, item: Any
                 ) -> dict[str, Any]:
    """One cold request stage by stage, then the same request with its prompt cached."""
    stages: dict[str, Any] = {}
    for run in ("cold", "cached"):
        clock = time.perf_counter()
        prompt, call_format = chat_prompt(loaded.tokenizer, item.messages, item.openai_tools)
        template = time.perf_counter()
        job = engine.start(prompt, drafters.for_request("ttft", item.tools is not None),
                           tools=item.tools, call_format=call_format,
                           conversation=conversation_text(item.messages), tenant="ttft")
        opened = time.perf_counter()
        steps = 0
        while not job.done:
            outcome = engine.step([job]).outcomes[0]
            steps += 1
            if outcome.event.tokens:
                break
        first = time.perf_counter()
        job.close()
        stages[run] = {"prompt_tokens": len(prompt), "cached_tokens": job.cached_tokens,
                       "template_and_tokenizer_ms": 1000 * (template - clock),
                       "open_ms (drafter)": 1000 * (opened - template),
                       "steps_to_first_token": steps,
                       "prefill_and_first_tree_ms": 1000 * (first - opened),
                       "total_ms": 1000 * (first - clock)}
        print(f"\nTTFT {run}: " + json.dumps({k: round(v, 1) if isinstance(v, float) else v
                                              for k, v in stages[run].items()}))
    return stages


if __name__ == "__main__":
    raise SystemExit(main())
