"""``toolspec bench cost-curve``: what verifying k tokens costs relative to one token.

The draft budget must follow this curve: on hardware where 32 tokens cost little more than one,
big trees pay; where they cost several steps, only short, likely drafts do.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from toolspec.draft_tree import DraftTree
from toolspec.target_model import TargetModel, commit_path

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def measure_cost_curve(
    model: TargetModel,
    prefix_length: int = 300,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 5,
    seed: int = 0,
) -> dict[int, float]:
    """Median seconds of one verification forward over k tokens (root + k-1 draft nodes)."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, model.vocab_size - 100, (prefix_length,), generator=generator)
    cache = model.new_cache()
    model.prefill(cache, prefix.tolist())
    timings: dict[int, float] = {}
    for size in sizes:
        chain = torch.randint(100, model.vocab_size - 100, (size,), generator=generator).tolist()
        tree = DraftTree.from_sequences([(chain[1:], "cost")])
        samples = []
        for _ in range(repeats + 1):  # the first run of each size warms kernels up
            started = time.perf_counter()
            model.forward_tree(cache, chain[0], tree)
            samples.append(time.perf_counter() - started)
            commit_path(cache, prefix_length, [])
        timings[size] = statistics.median(samples[1:])
    return timings


def format_cost_curve(timings: dict[int, float]) -> str:
    one = timings[min(timings)]
    lines = [f"{'k':>5}{'ms':>10}{'x k=1':>8}", "-" * 23]
    lines += [f"{k:>5}{t * 1000:>10.1f}{t / one:>8.2f}" for k, t in timings.items()]
    return "\n".join(lines)
