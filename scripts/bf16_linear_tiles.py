"""Diagnostic for exact bf16: can bf16 linear layers give every row the same bits whatever the
row count?

For each linear shape of a model (the default model's by default; random weights of its
shapes, or ``--model`` to load the real ones) it checks, in bf16 on this CPU:

- **row-count dependence**: for which row counts k the rows of a k-row call differ bitwise
  from the same rows in a 64-row call, with PyTorch's stock ``F.linear`` and with the weight
  prepacked for oneDNN (``mkldnn._reorder_linear_weight`` + ``_linear_pointwise``);
- **fixed tiles**: whether a call of exactly T rows (the real rows first, anything after)
  gives each real row the same bits whatever the other rows hold and however many are real —
  then padding every call to T rows (longer inputs in T-row tiles) makes a verification row
  bitwise a one-row step's;
- the time of one call per variant and row count.

    .venv/bin/python scripts/bf16_linear_tiles.py [--tiles 8,16,32,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# (out_features, in_features) of Qwen2.5-0.5B's linear layers.
DEFAULT_SHAPES = {"q_proj": (896, 896), "k_proj": (128, 896), "gate_proj": (4864, 896),
                  "down_proj": (896, 4864), "lm_head": (151936, 896)}

Linear = Callable[[torch.Tensor], torch.Tensor]


def variants(weight: torch.Tensor) -> dict[str, Linear]:
    """The stock kernel and the oneDNN kernel on a prepacked copy of ``weight``."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 128)
    return {"stock": lambda rows: F.linear(rows, weight),
            "packed": lambda rows: torch.ops.mkldnn._linear_pointwise(
                rows, packed, None, "none", [], "")}


def differing_counts(linear: Linear, rows: torch.Tensor) -> list[int]:
    """Row counts k whose k-row call rounds a row apart from the full call."""
    full = linear(rows)
    return [k for k in range(1, len(rows)) if not torch.equal(linear(rows[:k]), full[:k])]


def tile_invariant(linear: Linear, rows: torch.Tensor, other: torch.Tensor, tile: int) -> bool:
    """Whether each of the first k rows of a ``tile``-row call has the same bits for every
    k <= tile, whatever the rows after them hold."""
    reference = linear(rows[:tile])
    return all(torch.equal(linear(torch.cat([rows[:k], other[: tile - k]]))[:k], reference[:k])
               for k in range(1, tile + 1))


def call_ms(linear: Linear, rows: torch.Tensor, repeats: int = 10) -> float:
    for _ in range(2):
        linear(rows)
    began = time.perf_counter()
    for _ in range(repeats):
        linear(rows)
    return (time.perf_counter() - began) / repeats * 1e3


def measure(shapes: dict[str, tuple[int, int]], tiles: list[int], rows: int = 64,
            seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    report: dict[str, Any] = {}
    for name, (out_features, in_features) in shapes.items():
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.02).bfloat16()
        inputs = torch.randn(rows, in_features, generator=generator).bfloat16()
        other = torch.randn(rows, in_features, generator=generator).bfloat16()
        entry: dict[str, Any] = {}
        for label, linear in variants(weight).items():
            entry[label] = {
                "differing_row_counts": differing_counts(linear, inputs),
                "ms": {k: round(call_ms(linear, inputs[:k]), 3) for k in (1, 16, rows)},
            }
        packed = variants(weight)["packed"]
        entry["packed_tiles"] = {tile: tile_invariant(packed, inputs, other, tile)
                                 for tile in tiles if tile <= rows}
        report[name] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", default="8,16,32,64")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--small", action="store_true", help="small shapes (a smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    shapes = {"small": (48, 32)} if args.small else DEFAULT_SHAPES
    report = measure(shapes, [int(t) for t in args.tiles.split(",")])
    for name, entry in report.items():
        for label in ("stock", "packed"):
            counts = entry[label]["differing_row_counts"]
            print(f"{name:10s} {label:6s} rows apart at {len(counts)} of 63 row counts; ms "
                  + ", ".join(f"{k} rows {ms}" for k, ms in entry[label]["ms"].items()))
        print(f"{name:10s} packed, fixed tiles invariant: {entry['packed_tiles']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
