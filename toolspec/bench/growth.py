"""MAT as the call library grows from empty: the cold-start curve.

Reads per-item rows of ``toolspec sim --json`` reports (one series: the drafter) and of
``toolspec bench`` ``items.jsonl`` files (one series per method) and draws MAT against the number
of calls stored when each item began, over windows of consecutive items.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolspec.bench.run import verification_counts


class GrowthInputError(ValueError):
    """A file that holds neither a sim report with per-item rows nor bench items."""


@dataclass(frozen=True)
class GrowthPoint:
    """A window of consecutive items: mean calls stored, and MAT over the window's steps."""

    library_calls: float
    mat: float
    items: int


def read_series(path: Path) -> dict[str, list[tuple[int, int, int]]]:
    """Per series name, rows of (calls stored before the item, steps, tokens emitted by steps)."""
    if path.suffix == ".jsonl":
        series: dict[str, list[tuple[int, int, int]]] = {}
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            if row.get("library_calls") is not None and row["steps"]:
                tokens, forwards = verification_counts(row["decode_tokens"], row["steps"],
                                                       row.get("prefill_accepted"))
                series.setdefault(row["method"], []).append(
                    (row["library_calls"], forwards, tokens))
        if not series:
            raise GrowthInputError(f"{path}: no bench item was run with a call library")
        return series
    report = json.loads(Path(path).read_text())
    rows = [(r["library_calls"], r["steps"], r["emitted"]) for r in report.get("per_item", ())
            if r["library_calls"] is not None and r["steps"]]
    if not rows:
        raise GrowthInputError(f"{path}: not a `toolspec sim --json` report run with a library")
    return {report.get("drafter", path.stem): rows}


def growth_points(rows: Sequence[tuple[int, int, int]], window: int) -> list[GrowthPoint]:
    """Rows in item order, cut into windows of ``window`` items (the last may be shorter)."""
    points = []
    for start in range(0, len(rows), window):
        chunk = rows[start:start + window]
        steps = sum(r[1] for r in chunk)
        points.append(GrowthPoint(sum(r[0] for r in chunk) / len(chunk),
                                  sum(r[2] for r in chunk) / steps, len(chunk)))
    return points
