"""``toolspec bench --concurrency 1,2,4,8``: throughput and latency against concurrency, no HTTP.

For each level N and method, N clients each send the data set's items one after another (a
closed loop: a new item starts as soon as one finishes), and the engine batches every active
request into each forward (``Engine.step``), as a replica does. Per level and method:
completion tokens/s, TTFT (the first step that emits a token) and latency p50/p99, MAT, and
whether each output equals plain decoding's at concurrency 1 (fp32: it must; bf16: near-ties
may flip). Methods alternate in order from level to level, so a noisy machine slows all alike.
Retrieval methods start each run from an empty call library that each finished item fills, as
a replica's does.
"""

from __future__ import annotations

import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.datasets import BenchItem
from toolspec.bench.methods import BASELINE, METHODS, MethodSetup, split_budget
from toolspec.bench.observers import MarginRecorder, observers_for
from toolspec.bench.run import first_difference, offered_tools
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.core.batch import BatchDriver
from toolspec.core.engine import Engine, Generation, GenerationParams, StepOutcome
from toolspec.core.job import DecodeJob
from toolspec.library import CallLibrary
from toolspec.registry import LIBRARY_METHODS


@dataclass(frozen=True)
class Timed:
    """One item's generation in a closed-loop run: its tokens, when it first emitted and when
    it ended (from its start), and how many forwards verified its trees."""

    tokens: tuple[int, ...]
    ttft_s: float
    latency_s: float
    verifications: int  # forwards that verified a tree (or decoded a token after the first)
    verified_tokens: int  # the tokens those forwards emitted (MAT's numerator)
    margins: tuple[float, ...] | None = None  # top-1 minus top-2 logit, when recorded


def closed_loop(engine: Engine, count: int, concurrency: int,
                start_job: Callable[[int], DecodeJob],
                finished: Callable[[int, Generation], None] = lambda index, generation: None,
                step_rows: int | None = None) -> tuple[list[Timed], float]:
    """Run jobs ``0..count-1`` with at most ``concurrency`` active, each step one forward for
    all of them (the one batch driver, as a replica runs them); ``finished`` is told each
    generation as it ends. Returns the timings in job order and the wall time of the whole run.
    Raises a job's failure."""
    waiting = iter(range(count))
    first: dict[int, float] = {}
    results: list[Timed | None] = [None] * count
    driver: BatchDriver[DecodeJob] = BatchDriver(lambda jobs: engine.step(jobs, step_rows))
    began = time.perf_counter()

    def deliver(index: int, started: float, outcome: StepOutcome) -> bool:
        if outcome.error is not None:
            raise outcome.error
        now = time.perf_counter()
        if outcome.event.tokens and index not in first:
            first[index] = now - started
        generation = outcome.event.generation
        if generation is None:
            return False
        results[index] = Timed(
            generation.tokens, first[index], now - started, len(generation.verifications),
            sum(step.emitted for step in generation.verifications))
        finished(index, generation)
        return True

    def fill() -> None:
        while len(driver) < concurrency:
            index = next(waiting, None)
            if index is None:
                return
            driver.add(start_job(index), functools.partial(deliver, index, time.perf_counter()))

    fill()
    while driver:
        driver.turn()
        fill()
    return results, time.perf_counter() - began  # type: ignore[return-value]


def run_levels(engines: Mapping[str, Engine], tokenizer: PreTrainedTokenizerBase,
               items: Sequence[BenchItem], methods: Sequence[str], levels: Sequence[int],
               params: GenerationParams, step_rows: int = 512, tenant: str = "default",
               progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every method at every level (``ar`` at 1 first: the reference outputs). Returns the
    ``concurrency.json`` document's ``levels`` and ``identical`` parts."""
    prompts = [chat_prompt(tokenizer, item.messages, item.openai_tools) for item in items]
    reference: list[Timed] | None = None
    levels_out: dict[str, dict[str, Any]] = {method: {} for method in methods}
    for number, level in enumerate([1, *[n for n in levels if n != 1]]):
        order = methods if number % 2 == 0 else list(reversed(methods))
        if number == 0:  # ar first at level 1: every other output is compared with it
            order = [BASELINE, *[m for m in methods if m != BASELINE]]
        for method in order:
            with tempfile.TemporaryDirectory() as folder:
                needs_library = split_budget(method)[0] in LIBRARY_METHODS
                library = CallLibrary(folder, sync=False) if needs_library else None
                drafter_for = METHODS[split_budget(method)[0]](MethodSetup(tokenizer, library,
                                                                           tenant))

                # The reference run records its logit margins: a later output that differs
                # is then told apart as a near-tie (bf16 rounding) or not.
                recorders: dict[int, MarginRecorder] = {}

                def start(index: int) -> DecodeJob:
                    item, (prompt, call_format) = items[index], prompts[index]
                    drafter = drafter_for(())
                    margins = recorders.setdefault(index, MarginRecorder()) \
                        if reference is None else None
                    return engines[method].start(
                        prompt, drafter, params, tools=item.tools,
                        call_format=call_format, conversation=conversation_text(item.messages),
                        tenant=tenant, observers=observers_for(drafter, margins))

                def learn(index: int, generation: Generation) -> None:
                    if library is not None:
                        library.remember(prompts[index][1].parse(generation.text),
                                         offered_tools(items[index]), tenant)

                timings, wall = closed_loop(engines[method], len(items), level, start, learn,
                                            step_rows)
                timings = [replace(timed, margins=tuple(recorders[index].margins))
                           if index in recorders else timed
                           for index, timed in enumerate(timings)]
                if reference is None and method == BASELINE:
                    reference = timings
                if library is not None:
                    library.close()
            levels_out[method][str(level)] = summarize_level(timings, wall, reference)
            progress(f"{method:>12} x{level:<3} " + json.dumps(
                {k: round(v, 3) if isinstance(v, float) else v
                 for k, v in levels_out[method][str(level)].items()}))
    return levels_out


def summarize_level(timings: Sequence[Timed], wall: float,
                    reference: Sequence[Timed] | None) -> dict[str, Any]:
    tokens = sum(len(timed.tokens) for timed in timings)
    ttfts = sorted(timed.ttft_s for timed in timings)
    latencies = sorted(timed.latency_s for timed in timings)
    return {
        "items": len(timings),
        "completion_tokens_per_s": tokens / wall if wall else 0.0,
        "requests_per_s": len(timings) / wall if wall else 0.0,
        "ttft_p50_s": _quantile(ttfts, 0.5), "ttft_p99_s": _quantile(ttfts, 0.99),
        "latency_p50_s": _quantile(latencies, 0.5),
        "latency_p99_s": _quantile(latencies, 0.99),
        "mat": sum(timed.verified_tokens for timed in timings)
        / max(1, sum(timed.verifications for timed in timings)),
        "identical_to_ar": None if reference is None else statistics.mean(
            timed.tokens == want.tokens for timed, want in zip(timings, reference)),
        "divergences": [] if reference is None else divergences(timings, reference),
    }


def divergences(timings: Sequence[Timed], reference: Sequence[Timed]) -> list[dict[str, Any]]:
    """Per output that differs from plain decoding's alone: where, and plain decoding's top-1
    minus top-2 logit there (small: a near-tie that rounding can flip)."""
    found = []
    for index, (timed, want) in enumerate(zip(timings, reference)):
        position = first_difference(timed.tokens, want.tokens)
        if position is None:
            continue
        margin = want.margins[position] if want.margins and position < len(want.margins) \
            else None
        found.append({"item": index, "position": position, "ar_margin": margin})
    return found


def _quantile(values: Sequence[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


def write_document(out: Path, document: Mapping[str, Any]) -> list[Path]:
    """``concurrency.json`` and ``concurrency.png`` (throughput and p99 TTFT vs level)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "concurrency.json").write_text(json.dumps(document, indent=2))
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method, rows in document["levels"].items():
        levels = sorted(rows, key=int)
        counts = [int(level) for level in levels]
        left.plot(counts, [rows[n]["completion_tokens_per_s"] for n in levels], "o-",
                  label=method)
        right.plot(counts, [rows[n]["ttft_p99_s"] for n in levels], "o-", label=method)
    left.set(xscale="log", xlabel="concurrent requests", ylabel="completion tokens / s",
             title=f"{document['model']} {document['dtype']}: throughput")
    right.set(xscale="log", xlabel="concurrent requests", ylabel="seconds",
              title="time to first token, p99")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "concurrency.png", dpi=120)
    plt.close(figure)
    return [out / "concurrency.json", out / "concurrency.png"]


