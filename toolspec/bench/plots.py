"""PNG plots of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from toolspec.bench.analysis import HistoryPoint, history_label  # noqa: E402
from toolspec.bench.growth import growth_points  # noqa: E402
from toolspec.bench.run import linear_kernels  # noqa: E402


def _curve_label(curve: Mapping[str, Any]) -> str:
    kernels = linear_kernels(curve)
    return f"{curve['model']} {curve['dtype']}" + (f", {kernels}" if kernels else "")


def plot_cost_curves(curves: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Relative verification cost vs tokens per forward, one line per ``cost_curve.json``."""
    figure, axis = plt.subplots(figsize=(6, 4))
    for curve in curves:
        sizes = [int(k) for k in curve["relative"]]
        axis.plot(sizes, list(curve["relative"].values()), marker="o",
                  label=_curve_label(curve))
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
                window: int = 25,
                title: str = "MAT as the call library grows (cold start)") -> None:
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


def plot_speedups(speedups: Mapping[str, Mapping[str, float]], path: Path,
                  title: str = "End-to-end speed-up vs plain decoding") -> None:
    """Grouped bars: per data set (``speedups`` keys), one bar per method, each labelled with
    its value. The axis is logarithmic because the oracle's bars can be ten times the others'
    and would flatten them on a linear one."""
    datasets = list(speedups)
    methods = list(dict.fromkeys(m for row in speedups.values() for m in row))
    width = 0.8 / max(1, len(methods))
    figure, axis = plt.subplots(figsize=(min(16.0, max(6.5, 0.3 * len(datasets) * len(methods))),
                                         4.6))
    for index, method in enumerate(methods):
        xs = [i + (index - (len(methods) - 1) / 2) * width for i in range(len(datasets))]
        values = [speedups[d].get(method, 0.0) for d in datasets]
        bars = axis.bar(xs, values, width, label=method)
        axis.bar_label(bars, labels=[f"{v:.1f}" if v > 0 else "" for v in values],
                       fontsize=6, rotation=90, padding=2)
    axis.set_yscale("log", base=2)
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
    axis.margins(y=0.15)
    axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axis.set_xticks(range(len(datasets)), datasets, rotation=20, ha="right")
    axis.set_ylabel("× plain decoding (ar), log scale")
    axis.set_title(title)
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize="small", ncol=3)
    _save(figure, path)


def plot_first_steps(accepted: Mapping[str, Sequence[Sequence[int]]], path: Path) -> None:
    """The distribution of draft tokens accepted in the first verification steps (the paper's
    Fig. 7): ``accepted[method][step]`` lists one count per item; one panel per step."""
    steps = max((len(per_step) for per_step in accepted.values()), default=0)
    figure, axes = plt.subplots(1, max(1, steps), figsize=(5.5 * max(1, steps), 3.8),
                                squeeze=False)
    for step, axis in enumerate(axes[0]):
        counts = {m: list(per_step[step]) for m, per_step in accepted.items()
                  if len(per_step) > step and per_step[step]}
        top = max((max(v) for v in counts.values()), default=0)
        width = 0.8 / max(1, len(counts))
        for index, (method, values) in enumerate(counts.items()):
            shares = [values.count(k) / len(values) for k in range(top + 1)]
            xs = [k + (index - (len(counts) - 1) / 2) * width for k in range(top + 1)]
            axis.bar(xs, shares, width, label=method)
        axis.set_xlabel("draft tokens accepted")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("share of items")
        axis.set_title(f"verification step {step + 1}")
        axis.grid(True, axis="y", alpha=0.3)
        if counts:
            axis.legend(fontsize="small")
    _save(figure, path)


def plot_tool_history(series: Mapping[str, Sequence[HistoryPoint]], path: Path) -> None:
    """MAT and decode speed-up vs earlier calls of the item's tool (the paper's Fig. 8)."""
    figure, (mat_axis, speed_axis) = plt.subplots(1, 2, figsize=(11, 4))
    buckets = sorted({p.earlier for points in series.values() for p in points})
    for method, points in series.items():
        xs = [buckets.index(p.earlier) for p in points]
        mat_axis.plot(xs, [p.mat for p in points], marker="o", label=method)
        speed_axis.plot(xs, [p.decode_speedup for p in points], marker="o", label=method)
    for axis, label in ((mat_axis, "MAT (tokens per step)"), (speed_axis, "decode × ar")):
        axis.set_xticks(range(len(buckets)), [history_label(b) for b in buckets])
        axis.set_xlabel("earlier calls of the same tool in the run")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    speed_axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    mat_axis.legend(fontsize="small")
    _save(figure, path)


def plot_acceptance(by_state: Mapping[str, Mapping[str, Mapping[str, float]]],
                    by_source: Mapping[str, Mapping[str, float]], path: Path) -> None:
    """Left: per call state, the share of its tokens each method accepted from drafts. Right:
    per method, the share of its decode tokens each draft source supplied (stacked)."""
    figure, (state_axis, source_axis) = plt.subplots(1, 2, figsize=(13, 4.5))
    states = list(dict.fromkeys(s for rows in by_state.values() for s in rows))
    width = 0.8 / max(1, len(by_state))
    for index, (method, rows) in enumerate(by_state.items()):
        xs = [i + (index - (len(by_state) - 1) / 2) * width for i in range(len(states))]
        state_axis.bar(xs, [rows.get(s, {}).get("fraction", 0.0) for s in states], width,
                       label=method)
    state_axis.set_xticks(range(len(states)), states, rotation=35, ha="right")
    state_axis.set_ylabel("share of the state's tokens drafted")
    state_axis.set_title("acceptance per call state")
    sources = sorted({s for rows in by_source.values() for s in rows})
    methods = list(by_source)
    bottoms = [0.0] * len(methods)
    for source in sources:
        shares = [by_source[m].get(source, 0.0) for m in methods]
        source_axis.bar(range(len(methods)), shares, 0.6, bottom=bottoms, label=source)
        bottoms = [b + s for b, s in zip(bottoms, shares)]
    source_axis.set_xticks(range(len(methods)), methods, rotation=20, ha="right")
    source_axis.set_ylabel("share of decode tokens accepted from drafts")
    source_axis.set_title("accepted tokens per draft source")
    for axis in (state_axis, source_axis):
        axis.grid(True, axis="y", alpha=0.3)
    if state_axis.get_legend_handles_labels()[0]:
        state_axis.legend(fontsize="small")
    if sources:  # beside the stacks, which would hide it
        source_axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(figure, path)


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
