"""The benchmark report: finished runs → one Markdown page with tables, goal checks and PNGs.

``toolspec bench report --config docs/report.toml`` runs every data set of the config (each
into ``<out>/<name>/``, resumably, items in data-set order) and then calls ``write_report``;
``toolspec bench plot`` draws the same PNGs for any run folders.
"""

from __future__ import annotations

import datetime
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.analysis import (
    Run,
    off_format_comparison,
    same_output_speedup,
    step_accepted,
    tool_history,
)
from toolspec.bench.methods import BASELINE, ORACLE, parse_methods, split_budget
from toolspec.bench.run import ItemResult, format_markdown, summarize
from toolspec.bench.scoring import score_output
from toolspec.bench.states import acceptance_by_state

BASELINES = ("pld", "samd", "recycling", "suffix")
FULL_METHOD = "toolspec"
# Below this share of its tokens emitted by decoding steps, a method's decode speed-up is a
# ratio of near-zero times (the oracle's output rides almost whole on the prefill): shown as –.
MIN_DECODE_SHARE = 0.1
# The benchmark's goals, end to end (prompt in, last token out) unless named decode: on every set
# ≥ 3× plain decoding, ≥ 1.5× the best baseline (≥ 1.7× on API-Bank and BFCL), never below it;
# decode speed-up (prefill's tokens excluded) ≥ 5× on BFCL.
GOALS = {"e2e_vs_ar": 3.0, "e2e_vs_best_baseline": 1.5}
GOALS_APIBANK_BFCL = {"e2e_vs_best_baseline": 1.7}
GOALS_BFCL = {"decode_vs_ar": 5.0}
FIRST_STEPS = 2
# ar's top-1 minus top-2 logit below which a divergence counts as a near-tie: a few steps of
# bf16's resolution at this model's logit magnitudes (8 significant bits: steps of 0.0625 from 8
# to 16, 0.125 from 16 to 32), which is how far a one-row and a many-row forward of the same
# tokens may round apart. A margin of 0 is an exact tie, which argmax breaks by token id.
NEAR_TIE_LOGITS = 0.5


class ReportConfigError(ValueError):
    """A report config that is missing, unreadable or lacks a required entry."""


@dataclass(frozen=True)
class ReportDataset:
    """A data set of the report. ``dev_items``: its first items may be replayed for tuning and
    are left out (the report runs the rest); ``tuned``: the whole set was used for tuning, so
    its figures are not results (the report says so)."""

    name: str  # the run folder under ``out`` and the label in the report
    data: str  # a ``--data`` spec
    limit: int | None = None
    dev_items: int = 0
    tuned: bool = False

    @property
    def tuning(self) -> str:
        """Whether the set was used for tuning, as the report states it."""
        if self.tuned:
            return "tuned on: not a result"
        if self.dev_items:
            return f"first {self.dev_items} tuned on, left out"
        return "never tuned on"

    @property
    def family(self) -> str:
        """``bfcl``, ``apibank`` or ``other``: which goals apply."""
        if self.data.startswith("bfcl:"):
            return "bfcl"
        return "apibank" if "api-bank" in self.data or "apibank" in self.data else "other"


@dataclass(frozen=True)
class ReportConfig:
    datasets: tuple[ReportDataset, ...]
    methods: str
    model: str
    dtype: str = "auto"
    budget: str = "auto"
    max_new_tokens: int = 192
    out: Path = Path("results/report")
    docs: Path = Path("docs")
    prepack_linear: bool = True  # as ``--prepack-linear``
    exact_bf16: bool = False  # as ``--exact-bf16``

    def limited(self, limit: int | None) -> ReportConfig:
        """Every data set capped at ``limit`` items (None: as configured)."""
        if limit is None:
            return self
        return replace(self, datasets=tuple(
            replace(d, limit=min(limit, d.limit) if d.limit is not None else limit)
            for d in self.datasets))


def load_config(path: Path) -> ReportConfig:
    """A TOML config: top-level run options and ``[[datasets]]`` tables (name, data, limit)."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ReportConfigError(f"{path}: {error}") from None
    try:
        datasets = tuple(ReportDataset(str(d["name"]), str(d["data"]), d.get("limit"),
                                       int(d.get("dev_items", 0)), bool(d.get("tuned", False)))
                         for d in raw["datasets"])
        methods = str(raw["methods"])
        model = str(raw["model"])
    except (KeyError, TypeError) as error:
        raise ReportConfigError(f"{path}: missing {error} (needs model, methods and "
                                f"[[datasets]] with name and data)") from None
    parse_methods(methods)
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise ReportConfigError(f"{path}: data set names must be unique: {names}")
    if "packed_rows" in raw:
        raise ReportConfigError(f"{path}: packed_rows is gone: linear weights are prepacked for "
                                f"oneDNN for every row count (prepack_linear = true or false)")
    base = Path(path).parent
    return ReportConfig(datasets, methods, model, str(raw.get("dtype", "auto")),
                        str(raw.get("budget", "auto")), int(raw.get("max_new_tokens", 192)),
                        Path(raw.get("out", "results/report")), Path(raw.get("docs", base)),
                        _flag(path, "prepack_linear", raw.get("prepack_linear", True)),
                        _flag(path, "exact_bf16", raw.get("exact_bf16", False)))


def _flag(path: Path, name: str, value: Any) -> bool:
    """A true-or-false option of the config (``prepack_linear``, ``exact_bf16``)."""
    if not isinstance(value, bool):
        raise ReportConfigError(f"{path}: {name} must be true or false, got {value!r}")
    return value


def rescored(run: Run, items: Sequence[Any], tokenizer: PreTrainedTokenizerBase) -> Run:
    """``run`` with call accuracy and format adherence filled in for results recorded before
    they existed, from the data set's ``items`` and the formats the prompts ask for."""
    from toolspec.calls.prompts import chat_prompt

    by_id = {item.id: item for item in items}
    formats: dict[str, Any] = {}
    results = []
    for r in run.results:
        item = by_id.get(r.item)
        if r.call_correct is None and item is not None:
            if item.id not in formats:
                formats[item.id] = chat_prompt(tokenizer, item.messages, item.openai_tools)[1]
            score = score_output(item, r.text, formats[item.id])
            r = replace(r, call_correct=score.call_correct, format_adherent=score.format_adherent,
                        wrapped=score.wrapped)
        results.append(r)
    return replace(run, results=tuple(results))


def summaries(runs: Sequence[Run]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per run, its methods' summaries recomputed from the items (so newer metrics appear for
    older runs as far as their items allow)."""
    return {run.name: summarize(run.results, run.methods) for run in runs}


def goal_rows(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """toolspec's figures the goals are about, for one data set (None where a method did not
    run): e2e speed-up vs ar and vs the best baseline that ran (the best by e2e), decode
    speed-up vs ar (prefill's tokens excluded), and its share of the oracle's e2e speed-up."""
    full = summary.get(FULL_METHOD)
    best_method = best_baseline(summary)
    best = summary[best_method]["e2e_speedup"] if best_method else None
    oracle = summary.get(ORACLE)
    return {
        "e2e_vs_ar": full["e2e_speedup"] if full else None,
        "e2e_vs_best_baseline": full["e2e_speedup"] / best if full and best else None,
        "decode_vs_ar": full["decode_speedup"] if full else None,
        "oracle_fraction": full["e2e_speedup"] / oracle["e2e_speedup"]
        if full and oracle and oracle["e2e_speedup"] else None,
    }


def best_baseline(summary: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The baseline with the best e2e speed-up in ``summary`` (None if none ran)."""
    ran = [m for m in BASELINES if m in summary]
    return max(ran, key=lambda m: summary[m]["e2e_speedup"]) if ran else None


def _same_outputs_cell(run: Run, summary: Mapping[str, Mapping[str, Any]]) -> str:
    best = best_baseline(summary)
    if best is None or FULL_METHOD not in summary:
        return "–"
    same = same_output_speedup(run.results, FULL_METHOD, best)
    return f"{_number(same.speedup)} ({same.items}/{same.of})"


def goals_for(dataset: ReportDataset | None) -> dict[str, float]:
    """The goals that apply to ``dataset`` (every set's, tightened for API-Bank and BFCL)."""
    goals = dict(GOALS)
    family = dataset.family if dataset is not None else "other"
    if family in ("apibank", "bfcl"):
        goals.update(GOALS_APIBANK_BFCL)
    if family == "bfcl":
        goals.update(GOALS_BFCL)
    return goals


def plot_runs(runs: Sequence[Run], directory: Path, prefix: str = "") -> list[Path]:
    """Every report PNG the ``runs`` have data for, written to ``directory``; returns them."""
    from toolspec.bench import plots

    directory.mkdir(parents=True, exist_ok=True)
    per_run = summaries(runs)
    methods = list(dict.fromkeys(m for run in runs for m in run.methods))
    drafting = [m for m in methods if m != BASELINE]
    written = []

    path = directory / f"{prefix}speedup.png"
    plots.plot_speedups({name: {m: s["e2e_speedup"] for m, s in summary.items()}
                         for name, summary in per_run.items()}, path)
    written.append(path)

    pooled = [r for run in runs for r in run.results]
    first = {m: [step_accepted(pooled, m, step) for step in range(FIRST_STEPS)]
             for m in drafting if split_budget(m)[0] != ORACLE}
    if any(values for per_step in first.values() for values in per_step):
        path = directory / f"{prefix}first_steps.png"
        plots.plot_first_steps(first, path)
        written.append(path)

    history = {m: tool_history([run.results for run in runs], m) for m in drafting
               if split_budget(m)[0] != ORACLE}
    if any(history.values()):
        path = directory / f"{prefix}tool_history.png"
        plots.plot_tool_history({m: points for m, points in history.items() if points}, path)
        written.append(path)

    by_state = {m: acceptance_by_state((r.tokens_by_state, r.drafted_by_state or {})
                                       for r in pooled
                                       if r.method == m and r.tokens_by_state is not None)
                for m in drafting}
    by_source = {m: _source_shares([r for r in pooled if r.method == m]) for m in drafting}
    if any(by_state.values()) or any(by_source.values()):
        path = directory / f"{prefix}acceptance.png"
        plots.plot_acceptance({m: rows for m, rows in by_state.items() if rows}, by_source, path)
        written.append(path)
    return written


def _source_shares(rows: Sequence[ItemResult]) -> dict[str, float]:
    accepted: Counter[str] = Counter()
    for r in rows:
        accepted.update(r.accepted_by_source)
    tokens = sum(r.decode_tokens for r in rows)  # every token but the first, drafts' share
    return {source: count / tokens for source, count in accepted.items()} if tokens else {}


def _decode_share(entry: Mapping[str, Any]) -> float:
    """The share of a method's output tokens its decoding steps emitted (not the first token,
    not the prefill's draft tokens)."""
    return entry["after_first_forward"] / entry["new_tokens"] if entry["new_tokens"] else 0.0


def _number(value: float | None, suffix: str = "×") -> str:
    return f"{value:.2f}{suffix}" if value is not None else "–"


def report_markdown(runs: Sequence[Run], images: Sequence[Path], command: str,
                    image_dir: str = "img",
                    datasets: Sequence[ReportDataset] = ()) -> str:
    """The report page: provenance, end-to-end speed-ups first (then decode), whether each set
    was tuned on, the goals, per-run tables, the PNGs."""
    per_run = summaries(runs)
    methods = list(dict.fromkeys(m for run in runs for m in run.methods))
    by_name = {dataset.name: dataset for dataset in datasets}
    first = runs[0].document if runs else {}
    lines = [
        "# Benchmark report",
        "",
        f"Generated {datetime.date.today().isoformat()} by `{command}` — do not edit by hand.",
        f"Model {first.get('model', '?')} {first.get('dtype', '?')}; machine: "
        f"{first.get('machine', '?')}.",
        "",
        "End-to-end speed-up (prompt in → last token out, prefill included) is the headline. "
        "Decode speed-up counts only the tokens emitted after the first forward: tokens a "
        "draft tree delivers in the prompt's forward are prefill's (a method whose decoding "
        f"steps emitted under {MIN_DECODE_SHARE:.0%} of its tokens shows – there). A set "
        "\"tuned on\" was "
        "replayed while the drafter's constants were chosen: its figures are no result.",
    ]
    for title, key in (("End-to-end speed-up vs plain decoding", "e2e_speedup"),
                       ("Decode speed-up vs plain decoding", "decode_speedup")):
        lines += ["", f"## {title}", "",
                  "| data set | items | tuning | " + " | ".join(methods) + " |",
                  "|---|---:|---|" + "---:|" * len(methods)]
        for run in runs:
            summary = per_run[run.name]
            items = len({r.item for r in run.results})
            cells = [_number(summary[m][key]) if m in summary and (
                key != "decode_speedup" or _decode_share(summary[m]) >= MIN_DECODE_SHARE)
                else "–" for m in methods]
            tuning = by_name[run.name].tuning if run.name in by_name else "–"
            lines.append(f"| {run.name} | {items} | {tuning} | " + " | ".join(cells) + " |")
    lines += ["", "## Goals (toolspec)", "",
              f"On every set: e2e ≥ {GOALS['e2e_vs_ar']}× vs ar and ≥ "
              f"{GOALS['e2e_vs_best_baseline']}× vs the best baseline ({', '.join(BASELINES)}, "
              f"the best by e2e), never below it; ≥ "
              f"{GOALS_APIBANK_BFCL['e2e_vs_best_baseline']}× on API-Bank and BFCL; decode "
              f"speed-up ≥ {GOALS_BFCL['decode_vs_ar']}× on BFCL. \"of oracle\" (e2e) is no "
              f"goal.", "",
              "\"same outputs\": toolspec × that baseline counted only on the items where both "
              "wrote ar's output (in bf16 a near-tie can send a method down another text, so "
              "the whole-set ratio compares different texts; it is no goal).", "",
              "| data set | tuning | e2e × ar | e2e × best baseline | same outputs | decode × ar "
              "| of oracle | met |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        dataset = by_name.get(run.name)
        goals, wanted = goal_rows(per_run[run.name]), goals_for(dataset)
        same = _same_outputs_cell(run, per_run[run.name])
        known = {k: v for k, v in goals.items() if v is not None and k in wanted}
        met = "–" if not known else ("yes" if all(v >= wanted[k] for k, v in known.items())
                                     else "no: " + ", ".join(k for k, v in known.items()
                                                             if v < wanted[k]))
        lines.append(f"| {run.name} | {dataset.tuning if dataset else '–'} | "
                     f"{_number(goals['e2e_vs_ar'])} | "
                     f"{_number(goals['e2e_vs_best_baseline'])} | {same} | "
                     f"{_number(goals['decode_vs_ar'])} | "
                     f"{_number(goals['oracle_fraction'], '')} | {met} |")
    lines += ["", *_off_format_section(runs, per_run)]
    lines += ["", *_divergence_section(runs, per_run), "", "## Per data set", ""]
    for run in runs:
        document = {**run.document, "methods": per_run[run.name]}
        lines += [f"### {run.name}", "", format_markdown(document), ""]
        states = {m: s["acceptance_by_state"] for m, s in per_run[run.name].items()
                  if s.get("acceptance_by_state") and m != BASELINE}
        if states:
            lines += ["Share of each call state's tokens accepted from drafts:", "",
                      _state_table(states), ""]
        ends = step_end_shares(per_run[run.name].get(FULL_METHOD, {}).get("acceptance_by_state"))
        if ends:
            lines += [f"Where {FULL_METHOD}'s tokens came from no draft (each verification "
                      f"step's bonus token, and the first token), share per call state: " +
                      ", ".join(f"{state} {share:.0%}" for state, share in ends.items()), ""]
    lines += ["## Plots", ""]
    lines += [f"![{image.stem}]({image_dir}/{image.name})" for image in images]
    return "\n".join(lines) + "\n"


def _off_format_section(runs: Sequence[Run], per_run: Mapping[str, Mapping[str, Any]]
                        ) -> list[str]:
    """toolspec against the best baseline where plain decoding's output leaves the call format
    ("follow what the model writes"), per data set that has such items."""
    rows = []
    for run in runs:
        best = best_baseline(per_run[run.name])
        if best is None or FULL_METHOD not in per_run[run.name]:
            continue
        off = off_format_comparison(run.results, FULL_METHOD, best)
        if not off.items:
            continue
        sources = ", ".join(f"{source} {share:.0%}" for source, share in
                            off.source_shares.items() if share >= 0.005) or "–"
        rows.append(f"| {run.name} | {off.items}/{off.of} | {best} | {_number(off.speedup)} | "
                    f"{_number(off.mat, '')} | {_number(off.other_mat, '')} | {sources} |")
    if not rows:
        return ["## Where plain decoding leaves the call format", "",
                "Every output of ar's parsed as calls in its data set's format."]
    return ["## Where plain decoding leaves the call format", "",
            f"Items whose ar output does not parse as calls in the set's format (a malformed "
            f"call, prose, a schema copied as a value). The call grammar has nothing to follow "
            f"there; {FULL_METHOD}'s drafts must come from what the text does. e2e ratio and "
            f"MAT (over decoding steps) on those items only; the sources are the shares of "
            f"{FULL_METHOD}'s output tokens each draft source delivered.", "",
            f"| data set | items | best baseline | {FULL_METHOD} × it (e2e) | MAT "
            f"{FULL_METHOD} | MAT baseline | {FULL_METHOD}'s tokens by source |",
            "|---|---:|---|---:|---:|---:|---|", *rows]


def step_end_shares(by_state: Mapping[str, Mapping[str, float]] | None
                    ) -> dict[str, float]:
    """Per call state, its share of the tokens no draft supplied, largest first: where the
    drafts stopped matching, so where more acceptance would come from."""
    missed = {state: row["tokens"] - row["drafted"] for state, row in (by_state or {}).items()}
    total = sum(missed.values())
    return {state: count / total for state, count in
            sorted(missed.items(), key=lambda item: -item[1]) if count} if total else {}


def divergence_rows(summary: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every output of ``summary`` that differs from ar's: method, item, first differing
    position, ar's top-1/top-2 logit margin there and whether that is a near-tie."""
    return [{"method": method, **divergence,
             "near_tie": divergence["ar_margin"] is not None
             and divergence["ar_margin"] <= NEAR_TIE_LOGITS}
            for method, entry in summary.items() for divergence in entry.get("divergences", ())]


def _divergence_section(runs: Sequence[Run], per_run: Mapping[str, Mapping[str, Any]]
                        ) -> list[str]:
    rows = [(run.name, row) for run in runs for row in divergence_rows(per_run[run.name])]
    outputs = sum(r.method != BASELINE for run in runs for r in run.results)  # ar's own excluded
    lines = ["## Outputs that differ from ar", ""]
    if not rows:
        return lines + [f"None: all {outputs} outputs equal ar's token for token."]
    ties = sum(row["near_tie"] for _, row in rows)
    lines += [f"{len(rows)} of {outputs} outputs differ from ar's; {ties} of them first differ "
              f"where ar's top two logits lie within {NEAR_TIE_LOGITS} (a near-tie: bf16 "
              f"rounding of a many-row verification forward can flip such an argmax).", "",
              "| data set | method | item | first different token | ar top-1 − top-2 logit "
              "| near-tie |", "|---|---|---|---:|---:|---|"]
    for name, row in rows:
        margin = f"{row['ar_margin']:.3f}" if row["ar_margin"] is not None else "–"
        lines.append(f"| {name} | {row['method']} | {row['item']} | {row['position']} | "
                     f"{margin} | {'yes' if row['near_tie'] else 'no'} |")
    return lines


def _state_table(states: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    names = list(dict.fromkeys(s for rows in states.values() for s in rows))
    lines = ["| method | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for method, rows in states.items():
        cells = [f"{rows[s]['fraction']:.0%}" if s in rows else "–" for s in names]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(runs: Sequence[Run], docs: Path, command: str, name: str = "report",
                 datasets: Sequence[ReportDataset] = ()) -> tuple[Path, list[Path]]:
    """``docs/<name>.md`` and ``docs/img/<name>_*.png`` from ``runs`` (``datasets``: their
    config entries, for the tuning column and the goals). Mutates: those files."""
    images = plot_runs(runs, docs / "img", prefix=f"{name}_")
    page = docs / f"{name}.md"
    page.write_text(report_markdown(runs, images, command, datasets=datasets))
    return page, images
