"""What verifying k tokens costs relative to one token, measured on this machine.

The draft budget must follow this curve: on hardware where 32 tokens cost little more than one,
big trees pay; where they cost several steps, only short, likely drafts do. Measured once per
(model, dtype, machine) and cached under ``$TOOLSPEC_HOME/cost-curves``.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Sequence

import torch

from toolspec import toolspec_home
from toolspec.core.budget import CostModel
from toolspec.core.draft_tree import DraftTree
from toolspec.model.attention import ATTENTION_REVISION, attention_implementation
from toolspec.model.loading import LoadedModel, dtype_name
from toolspec.model.machine import describe_machine
from toolspec.model.packages import exclusive_lock
from toolspec.model.target_model import TargetModel

# Dense at the small end, where CPU matmul kernels change regime (often between 3 and 4 rows).
DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def measure_cost_curve(
    model: TargetModel,
    prefix_length: int = 300,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 5,
    seed: int = 0,
) -> dict[int, float]:
    """Median seconds of one verification forward over k tokens (root + k-1 draft nodes).

    The sizes are timed in interleaved rounds (every size once per round), so a burst of
    load from elsewhere on a shared machine lands on one sample of many sizes rather than on
    every sample of one size; a first round warms the kernels up and is not counted.
    """
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, model.vocab_size - 100, (prefix_length,), generator=generator)
    cache = model.new_cache()
    model.prefill(cache, prefix.tolist())
    chains = {size: torch.randint(100, model.vocab_size - 100, (size,),
                                  generator=generator).tolist() for size in sizes}
    trees = {size: DraftTree.from_sequences([(chain[1:], "cost")])
             for size, chain in chains.items()}
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats + 1):
        for size in sizes:
            started = time.perf_counter()
            model.forward_tree(cache, chains[size][:1], trees[size])
            if model.device.type == "cuda":  # kernels run asynchronously: time their end
                torch.cuda.synchronize(model.device)
            samples[size].append(time.perf_counter() - started)
            model.commit_path(cache, prefix_length, [])
    return {size: statistics.median(times[1:]) for size, times in samples.items()}


def format_cost_curve(timings: dict[int, float]) -> str:
    one = timings[min(timings)]
    lines = [f"{'k':>5}{'ms':>10}{'x k=1':>8}", "-" * 23]
    lines += [f"{k:>5}{t * 1000:>10.1f}{t / one:>8.2f}" for k, t in timings.items()]
    return "\n".join(lines)


# Enough sizes to place the regime changes, up to the largest tree the budget verifies, and on
# to where a row's cost stops falling (the row budget per step: ``budget.rows_per_step``).
STARTUP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def cached_cost_model(loaded: LoadedModel, refresh: bool = False,
                      target: TargetModel | None = None) -> CostModel:
    """The cost curve of ``loaded`` on this machine, measured on first use and then cached.
    ``target``: how the model runs (default ``TargetModel(loaded.model)``; a split model's
    ``ShardedTarget``, whose curve is kept apart by its size).

    Mutates: writes ``$TOOLSPEC_HOME/cost-curves/<key>.json`` when it measures (under a lock
    file beside it, so processes sharing the machine measure once).
    """
    target = target or TargetModel(loaded.model)  # switches attention to the one measured
    machine = describe_machine(loaded.device)
    # Weight packing, the attention function and the split change the curve.
    kernels = "|packed=onednn" if loaded.prepacked_linear else ""
    kernels += "|exact_bf16" if loaded.exact_bf16 else ""
    kernels += f"|attention={attention_implementation(loaded.model)}.{ATTENTION_REVISION}"
    if loaded.tensor_parallel_size > 1:
        kernels += f"|tensor_parallel={loaded.tensor_parallel_size}"
    key = hashlib.sha256(
        f"{loaded.name}|{dtype_name(loaded.dtype)}|{machine}{kernels}".encode()).hexdigest()
    path = toolspec_home() / "cost-curves" / f"{key[:16]}.json"
    # Replicas starting together on one machine: one measures (alone, so the timings are not
    # each other's load) while the others wait, then read what it wrote.
    with exclusive_lock(path.with_name(f".{path.name}.lock")):
        if path.is_file() and not refresh:
            cached = CostModel.load(path)
            if cached.sizes[-1] >= STARTUP_SIZES[-1]:  # else measured before the row budget
                return cached
        timings = measure_cost_curve(target, sizes=STARTUP_SIZES, repeats=5)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(cost_curve_document(loaded, 300, timings), indent=2))
        partial.replace(path)  # a reader never sees half a file
    return CostModel.from_timings(timings)


def cost_curve_document(loaded: LoadedModel, prefix: int, timings: dict[int, float]) -> dict:
    one = timings[min(timings)]
    return {
        "model": loaded.name, "dtype": dtype_name(loaded.dtype), "prefix": prefix,
        "machine": describe_machine(loaded.device),
        "prepacked_linear": loaded.prepacked_linear,
        "attention": attention_implementation(loaded.model),
        "seconds": {str(k): t for k, t in timings.items()},
        "relative": {str(k): t / one for k, t in timings.items()},
    }
