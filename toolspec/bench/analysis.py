"""Reading finished ``toolspec bench`` runs back, and the per-item views the report plots.

A run is a ``--out`` folder: ``results.json`` (the summary) and ``items.jsonl`` (one
``ItemResult`` per item and method, in item order). Older ``items.jsonl`` files lack the fields
added for the report; they read with those set to None and the views skip what they lack.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolspec.bench.methods import BASELINE
from toolspec.bench.resume import ITEMS_FILE, read_item_results
from toolspec.bench.run import ItemResult
from toolspec.calls.formats import FORMATS

# Buckets of "earlier calls of the same tool" (lower bounds): 0, 1, 2, 3-4, 5-9, 10-19, 20+.
HISTORY_BUCKETS = (0, 1, 2, 3, 5, 10, 20)


class RunReadError(ValueError):
    """A folder that is not a finished ``toolspec bench --out`` run."""


@dataclass(frozen=True)
class Run:
    name: str
    document: Mapping[str, Any]  # results.json
    results: tuple[ItemResult, ...]  # items.jsonl, in order

    @property
    def methods(self) -> list[str]:
        return list(self.document["methods"])


def read_run(directory: Path, name: str | None = None) -> Run:
    """The run in ``directory``: its summary and the results it summarises, in item order
    (``items.jsonl`` may hold more: other items or methods kept from earlier runs)."""
    summary, items = directory / "results.json", directory / ITEMS_FILE
    if not summary.is_file() or not items.is_file():
        raise RunReadError(
            f"{directory}: needs results.json and {ITEMS_FILE} (toolspec bench --out)")
    document = json.loads(summary.read_text())
    results = [r for r in read_item_results(items) if r.method in document["methods"]]
    if "item_ids" in document:  # older summaries name no items: the file held just theirs
        order = {item: position for position, item in enumerate(document["item_ids"])}
        results = sorted((r for r in results if r.item in order), key=lambda r: order[r.item])
    return Run(name or directory.name, document, tuple(results))


@dataclass(frozen=True)
class SameOutputs:
    """``method`` against ``other`` on the items where both wrote ``ar``'s output."""

    items: int  # such items
    of: int  # items both methods ran
    speedup: float | None  # ``other``'s time over ``method``'s on them (None: no such item)


def _by_method(results: Sequence[ItemResult], methods: Sequence[str]
               ) -> dict[str, dict[str, ItemResult]]:
    """Per method of ``methods``, its results by item."""
    grouped: dict[str, dict[str, ItemResult]] = {m: {} for m in methods}
    for result in results:
        if result.method in grouped:
            grouped[result.method][result.item] = result
    return grouped


def _time_ratio(by_method: Mapping[str, Mapping[str, ItemResult]], items: Sequence[str],
                method: str, other: str) -> float | None:
    """``other``'s end-to-end time (prefill + decode) over ``method``'s, on ``items``."""
    spent = {m: sum(by_method[m][item].prefill_s + by_method[m][item].decode_s
                    for item in items) for m in (method, other)}
    return spent[other] / spent[method] if spent[method] else None


def same_output_speedup(results: Sequence[ItemResult], method: str, other: str) -> SameOutputs:
    """How much faster ``method`` is than ``other`` end to end (prefill + decode), counted only
    on items where both reproduce plain decoding. Where outputs diverge (bf16 near-ties) the two
    methods decode different texts, and one may just have been handed an easier one; on these
    items both wrote the same tokens."""
    by_method = _by_method(results, (method, other))
    both = [item for item in by_method[method] if item in by_method[other]]
    same = [item for item in both if by_method[method][item].identical_to_ar
            and by_method[other][item].identical_to_ar]
    if not same:
        return SameOutputs(0, len(both), None)
    return SameOutputs(len(same), len(both), _time_ratio(by_method, same, method, other))


@dataclass(frozen=True)
class OffFormat:
    """``method`` against ``other`` on the items where plain decoding's own output is not in
    the data set's call format (a malformed call, prose, a schema copied as a value): there
    the call grammar has nothing to follow, and drafts must come from what the text does."""

    items: int  # such items both methods ran
    of: int  # items both methods ran
    speedup: float | None  # ``other``'s e2e time over ``method``'s on them
    mat: float | None  # ``method``'s MAT over its decoding steps on them
    other_mat: float | None
    source_shares: Mapping[str, float]  # ``method``'s draft-accepted tokens per source / tokens


def off_format_comparison(results: Sequence[ItemResult], method: str, other: str) -> OffFormat:
    """``method`` vs ``other`` on the items whose ``ar`` output has ``format_adherent`` False
    (items scored before format adherence existed are left out)."""
    by_method = _by_method(results, (BASELINE, method, other))
    both = [item for item in by_method[method] if item in by_method[other]]
    off = [item for item in both if item in by_method[BASELINE]
           and by_method[BASELINE][item].format_adherent is False]
    if not off:
        return OffFormat(0, len(both), None, None, None, {})

    def mat(name: str) -> float | None:
        emitted, steps = map(sum, zip(*(by_method[name][item].verification_counts()
                                        for item in off)))
        return emitted / steps if steps else None

    accepted: Counter[str] = Counter()
    for item in off:
        accepted.update(by_method[method][item].accepted_by_source)
    tokens = sum(by_method[method][item].new_tokens for item in off)
    return OffFormat(len(off), len(both), _time_ratio(by_method, off, method, other),
                     mat(method), mat(other),
                     {source: count / tokens for source, count in accepted.most_common()}
                     if tokens else {})


def step_accepted(results: Sequence[ItemResult], method: str, step: int) -> list[int]:
    """Draft tokens accepted in verification step ``step`` (0-based) of each item of
    ``method`` that recorded its steps and had that many."""
    return [r.step_accepted[step] for r in results
            if r.method == method and r.step_accepted is not None and len(r.step_accepted) > step]


@dataclass(frozen=True)
class HistoryPoint:
    """Items whose tool had ``earlier`` (bucket lower bound) calls before them in the run."""

    earlier: int
    items: int
    mat: float
    decode_speedup: float  # the method's decode tokens/s over ar's, on these items


def tool_history(runs: Sequence[Sequence[ItemResult]], method: str) -> list[HistoryPoint]:
    """MAT and decode speed-up of ``method`` vs how many calls of the item's tool (the first
    call of ar's output) plain decoding produced on earlier items of the same run; the items of
    several ``runs`` (each in item order) are pooled per bucket."""
    grouped: dict[int, list[tuple[ItemResult, ItemResult]]] = {}
    parse = FORMATS["json"].parse  # its scanner reads either arguments key
    for results in runs:
        by_item: dict[str, dict[str, ItemResult]] = {}
        for r in results:
            by_item.setdefault(r.item, {})[r.method] = r
        seen: Counter[str] = Counter()
        for rows in by_item.values():
            if BASELINE not in rows:
                continue
            calls = parse(rows[BASELINE].text)
            if calls and method in rows:
                bucket = max(b for b in HISTORY_BUCKETS if b <= seen[calls[0].name])
                grouped.setdefault(bucket, []).append((rows[BASELINE], rows[method]))
            seen.update(call.name for call in calls)
    points = []
    for bucket, pairs in sorted(grouped.items()):
        verified, forwards = map(sum, zip(*(m.verification_counts() for _, m in pairs)))
        ours = _rate(sum(m.decode_tokens for _, m in pairs), sum(m.decode_s for _, m in pairs))
        ar = _rate(sum(a.decode_tokens for a, _ in pairs), sum(a.decode_s for a, _ in pairs))
        points.append(HistoryPoint(bucket, len(pairs), verified / forwards if forwards else 0.0,
                                   ours / ar if ar else 0.0))
    return points


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def history_label(bucket: int) -> str:
    """``3`` → ``"3-4"``, the last bucket → ``"20+"``."""
    index = HISTORY_BUCKETS.index(bucket)
    if index + 1 == len(HISTORY_BUCKETS):
        return f"{bucket}+"
    upper = HISTORY_BUCKETS[index + 1] - 1
    return str(bucket) if upper == bucket else f"{bucket}-{upper}"
