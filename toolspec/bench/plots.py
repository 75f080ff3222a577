"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from toolspec.bench.growth import growth_points  # noqa: E402


def plot_cost_curves(curves: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Relative verification cost vs tokens per forward, one line per ``cost_curve.json``."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for curve in curves:
        sizes = [int(k) for k in curve["relative"]]
        axis.plot(sizes, list(curve["relative"].values()), marker="o",
                  label=f"{curve['model']} {curve['dtype']}")
    axis.plot([1, max(sizes)], [1, max(sizes)], linestyle=":", color="grey",
              label="k sequential steps")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set_xlabel("tokens verified in one forward (k)")
    axis.set_ylabel("time relative to k = 1")
    axis.set_title(f"Verification cost, {curves[0]['prefix']}-token prefix")
    axis.legend()
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_growth(series: Mapping[str, Sequence[tuple[int, int, int]]], path: Path,
                window: int = 25, title: str = "MAT as the call library grows (cold start)") -> None:
    figure, axis = plt.subplots(figsize=(6.5, 4))
    for name, rows in series.items():
        points = growth_points(rows, window)
        axis.plot([p.library_calls for p in points], [p.mat for p in points], marker="o",
                  label=name)
    axis.set_xlabel(f"calls stored in the library (mean over windows of {window} items)")
    axis.set_ylabel("MAT (tokens per verification step)")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
