"""``toolspec bench``: methods run interleaved item by item against plain decoding (``ar``).

For each item ``ar`` runs first and every other method right after it on the same prompt, so a
noisy machine slows all methods alike. Per-item records go to ``items.jsonl`` as each item
finishes, the summary to ``results.json``; a run into the folder of an earlier one with the same
settings resumes after the items it finished (``toolspec.bench.resume``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.datasets import BenchItem
from toolspec.bench.methods import BASELINE, METHODS, ORACLE, MethodSetup, split_budget
from toolspec.bench.observers import MarginRecorder, observers_for
from toolspec.bench.scoring import score_output
from toolspec.bench.sim import SimTarget, simulate
from toolspec.bench.states import acceptance_by_state, state_counts
from toolspec.calls.formats import CallFormat
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.core.budget import CostModel
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.core.engine import Engine, Generation, GenerationParams
from toolspec.library import CallLibrary
from toolspec.model.cost_curve import cached_cost_model
from toolspec.model.loading import LoadedModel, dtype_name
from toolspec.model.machine import describe_machine
from toolspec.model.target_model import TargetModel
from toolspec.registry import build_engine


@dataclass(frozen=True)
class ItemResult:
    """One method on one item."""

    item: str
    method: str
    tokens: list[int]
    text: str
    new_tokens: int
    decode_tokens: int  # all but the first token (see ``Generation.decode_tokens``)
    steps: int  # verification steps after the prefill
    prefill_s: float
    decode_s: float
    accepted_by_source: dict[str, int]
    identical_to_ar: bool
    first_difference: int | None  # first position where the output differs from ar's
    ar_margin: float | None  # ar's top-1 minus top-2 logit at that position (near-tie if small)
    library_calls: int | None = None  # calls stored in the run's library when the item began
    # Recorded since the report (None in older items.jsonl):
    call_correct: bool | None = None  # parsed calls match the ground truth (bench.scoring)
    format_adherent: bool | None = None  # the output parses as calls in the expected format
    wrapped: bool | None = None  # ... inside the format's wrappers (``<tool_call>`` tags, ...)
    step_accepted: list[int] | None = None  # draft tokens accepted by each verification step
    tokens_by_state: dict[str, int] | None = None  # decode tokens written in each call state
    drafted_by_state: dict[str, int] | None = None  # ... of which accepted from a draft
    draft_s: float | None = None  # time in the drafter and budget, summed over the steps
    verify_s: float | None = None  # time in verification forwards, summed over the steps
    # Draft tokens accepted in the prefill forward (None: no tree rode on it, or an older run);
    # an accepted end token is counted among them, though it is no output token.
    prefill_accepted: int | None = None

    @property
    def prefill_emitted(self) -> int:
        """Draft tokens the prompt's forward emitted (``prefill_accepted`` without an accepted
        end token: an output riding whole on the prefill would count one token too many)."""
        return prefill_emitted(self.decode_tokens, self.prefill_accepted)

    @property
    def after_first_forward(self) -> int:
        """Tokens the decode phase emitted: those after the first forward. The first forward
        (the prompt's) emits the first token and, when a draft tree rode on it, that tree's
        accepted tokens — prefill's tokens, at prefill's price (``prefill_emitted``)."""
        return self.decode_tokens - self.prefill_emitted

    def verification_counts(self) -> tuple[int, int]:
        """(tokens emitted by the decoding steps, their number): MAT's numerator and
        denominator — the prompt's forward is no decoding step, whatever rode on it."""
        return verification_counts(self.decode_tokens, self.steps, self.prefill_accepted)


def prefill_emitted(decode_tokens: int, prefill_accepted: int | None) -> int:
    """Draft tokens the prompt's forward emitted: at most every token but the first."""
    return min(prefill_accepted or 0, decode_tokens)


def verification_counts(decode_tokens: int, steps: int, prefill_accepted: int | None
                        ) -> tuple[int, int]:
    """An item's (tokens emitted by decoding steps, their number): ``decode_tokens`` (every
    token but the first) less the draft tokens the prompt's forward emitted."""
    return decode_tokens - prefill_emitted(decode_tokens, prefill_accepted), steps


def first_difference(ours: Sequence[int], reference: Sequence[int]) -> int | None:
    for position, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            return position
    return None if len(ours) == len(reference) else min(len(ours), len(reference))


def _item_result(item: BenchItem, method: str, generation: Generation, ar: Generation,
                 ar_margins: Sequence[float], library_calls: int | None,
                 tokenizer: PreTrainedTokenizerBase, call_format: CallFormat) -> ItemResult:
    difference = first_difference(generation.tokens, ar.tokens)
    margin = None
    if difference is not None and difference < len(ar_margins):
        margin = ar_margins[difference]
    score = score_output(item, generation.text, call_format)
    by_state, drafted = state_counts(tokenizer, generation.tokens, generation.verifications,
                                     call_format, start=0 if generation.prefill_step else 1)
    return ItemResult(
        item=item.id,
        method=method,
        tokens=list(generation.tokens),
        text=generation.text,
        new_tokens=len(generation.tokens),
        decode_tokens=generation.decode_tokens,
        steps=len(generation.steps),
        prefill_s=generation.prefill_s,
        decode_s=generation.decode_s,
        accepted_by_source=dict(generation.accepted_by_source()),
        identical_to_ar=difference is None,
        first_difference=difference,
        ar_margin=margin,
        library_calls=library_calls,
        call_correct=score.call_correct,
        format_adherent=score.format_adherent,
        wrapped=score.wrapped,
        step_accepted=[step.accepted for step in generation.verifications],
        tokens_by_state=by_state,
        drafted_by_state=drafted,
        draft_s=sum(step.draft_s for step in generation.steps),
        verify_s=sum(step.verify_s for step in generation.steps),
        prefill_accepted=(generation.prefill_step.accepted
                          if generation.prefill_step is not None else None),
    )


def run_items(
    engines: Mapping[str, Engine],
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[BenchItem],
    methods: Sequence[str],
    params: GenerationParams,
    progress: bool = True,
    call_format: CallFormat | None = None,
    library: CallLibrary | None = None,
    tenant: str = "default",
    finished: Mapping[str, Mapping[str, ItemResult]] | None = None,
) -> Iterable[ItemResult]:
    """Yield one result per (item, method), ``ar`` first for every item, each method run by its
    engine in ``engines`` (see ``build_engines``).

    ``call_format`` overrides the format detected from each prompt. With a ``library``, the
    calls plain decoding produced on an item are added to it once every method has run on that
    item (a cold start fills it online, in item order). Items ``finished`` holds a result of
    every method for (an earlier run's, see ``resume.ResultLog``) are yielded from there, not run
    again; their calls still go to the library, and each method's drafter and budget relearn
    its output (``relearn``), so the items run after them draft as in an uninterrupted run.
    Mutates: ``library``, the engines' budgets.
    """
    finished = finished or {}
    if methods[0] != BASELINE:
        raise ValueError(f"the first method must be {BASELINE!r}, the reference")
    setup = MethodSetup(tokenizer, library)
    drafter_for = {method: METHODS[split_budget(method)[0]](setup) for method in methods}
    # Warm-up: the first forward pays one-off allocation and kernel-selection costs.
    engines[BASELINE].generate(chat_prompt(tokenizer, items[0].messages, items[0].openai_tools)[0],
                               None, GenerationParams(max_new_tokens=4))
    for item in tqdm(items, desc="items", unit="item", disable=not progress):
        prompt, item_format = chat_prompt(tokenizer, item.messages, item.openai_tools, call_format)
        earlier = finished.get(item.id, {})
        if all(method in earlier for method in methods):
            yield from (earlier[method] for method in methods)
            request = DraftRequest(tuple(prompt), item.tools, item_format,
                                   conversation_text(item.messages), tenant)
            for method in methods[1:]:
                relearn(engines[method], drafter_for[method](earlier[BASELINE].tokens),
                        SimTarget(item.id, tuple(prompt), tuple(earlier[method].tokens), request),
                        params.max_new_tokens, tokenizer)
            if library is not None:
                library.remember(item_format.parse(earlier[BASELINE].text),
                                 offered_tools(item), tenant)
            continue
        stored = library.stats().calls if library is not None else None
        ar_margins = MarginRecorder()  # near-tie or not, where another output differs
        ar = engines[BASELINE].generate(prompt, None, params, observers=(ar_margins,))
        margins = ar_margins.margins
        yield _item_result(item, BASELINE, ar, ar, margins, stored, tokenizer, item_format)
        for method in methods[1:]:
            drafter = drafter_for[method](ar.tokens)
            generation = engines[method].generate(prompt, drafter, params,
                                                  tools=item.tools, call_format=item_format,
                                                  conversation=conversation_text(item.messages),
                                                  tenant=tenant, observers=observers_for(drafter))
            yield _item_result(item, method, generation, ar, margins, stored, tokenizer,
                               item_format)
        if library is not None:
            library.remember(item_format.parse(ar.text), offered_tools(item), tenant)


def relearn(engine: Engine, drafter: Drafter, decoded: SimTarget, max_new_tokens: int,
            tokenizer: PreTrainedTokenizerBase) -> None:
    """Teach ``drafter`` and ``engine``'s budget the output an earlier run decoded, as decoding
    it would have: the same trees are proposed and sized, and the same tokens accepted (the
    model's choices are known), so a resumed run continues where the interrupted one stood.
    What only the model's logits teach (Token Recycling's adjacency rows) is not replayed.
    Mutates: ``drafter`` and ``engine.budget``."""
    simulate(drafter, [decoded], engine.budget, tokenizer, max_new_tokens=max_new_tokens,
             draft_at_prefill=engine.draft_at_prefill)


def summarize(results: Sequence[ItemResult], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: the end-to-end speed-up vs ar (the headline: prompt in → last token out),
    the mean time to first token, the decode speed-up over the tokens emitted after the
    first forward only (those accepted in the prompt's forward are prefill's:
    ``prefill_accepted``), MAT over decoding steps, identity, divergences, call accuracy and
    format adherence (None where no item was scored), acceptance per call state and, when
    ``oracle`` ran, ``oracle_fraction``: e2e speed-up / the oracle's e2e speed-up."""
    summary: dict[str, dict[str, Any]] = {}
    for method in methods:
        rows = [r for r in results if r.method == method]
        decode_s = sum(r.decode_s for r in rows)
        e2e_s = sum(r.prefill_s + r.decode_s for r in rows)
        steps = sum(r.steps for r in rows)
        decode_tokens = sum(r.after_first_forward for r in rows)
        verified_tokens, verifications = map(sum, zip(*(r.verification_counts() for r in rows))) \
            if rows else (0, 0)
        new_tokens = sum(r.new_tokens for r in rows)
        by_source: dict[str, int] = {}
        for r in rows:
            for source, count in r.accepted_by_source.items():
                by_source[source] = by_source.get(source, 0) + count
        summary[method] = {
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s else 0.0,
            "e2e_tokens_per_s": new_tokens / e2e_s if e2e_s else 0.0,
            "ttft_s": sum(r.prefill_s for r in rows) / len(rows) if rows else 0.0,
            "mat": verified_tokens / verifications if verifications else 0.0,
            "identical_to_ar": sum(r.identical_to_ar for r in rows) / len(rows) if rows else 0.0,
            "steps": steps,
            "prefill_accepted": sum(r.prefill_emitted for r in rows),
            "after_first_forward": decode_tokens,  # tokens the decoding steps emitted
            "new_tokens": new_tokens,
            "prefill_s": sum(r.prefill_s for r in rows),
            "decode_s": decode_s,
            "accepted_by_source": by_source,
            "divergences": [
                {"item": r.item, "position": r.first_difference, "ar_margin": r.ar_margin}
                for r in rows if not r.identical_to_ar
            ],
            "call_accuracy": _mean(r.call_correct for r in rows),
            "format_adherence": _mean(r.format_adherent for r in rows),
            "wrapper_adherence": _mean(r.wrapped for r in rows),
            "acceptance_by_state": acceptance_by_state(
                (r.tokens_by_state, r.drafted_by_state or {}) for r in rows
                if r.tokens_by_state is not None),
            "draft_ms_per_step": _per_step_ms(rows, "draft_s"),
            "verify_ms_per_step": _per_step_ms(rows, "verify_s"),
        }
    reference = summary[BASELINE]
    for entry in summary.values():
        entry["decode_speedup"] = _ratio(entry["decode_tokens_per_s"],
                                         reference["decode_tokens_per_s"])
        entry["e2e_speedup"] = _ratio(entry["e2e_tokens_per_s"], reference["e2e_tokens_per_s"])
    if ORACLE in summary:
        for entry in summary.values():
            entry["oracle_fraction"] = _ratio(entry["e2e_speedup"],
                                              summary[ORACLE]["e2e_speedup"])
    return summary


def _per_step_ms(rows: Sequence[ItemResult], field: str) -> float | None:
    """Mean milliseconds per step of a step timing (None where no row recorded it)."""
    timed = [(getattr(r, field), r.steps) for r in rows if getattr(r, field) is not None]
    steps = sum(count for _, count in timed)
    return 1000 * sum(seconds for seconds, _ in timed) / steps if steps else None


def _mean(flags: Iterable[bool | None]) -> float | None:
    known = [flag for flag in flags if flag is not None]
    return sum(known) / len(known) if known else None


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else 0.0


def results_document(
    loaded: LoadedModel, item_ids: Sequence[str], summary: dict[str, dict[str, Any]],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """``results.json``: the summary of ``item_ids`` (their results are the ones of
    ``items.jsonl`` it describes: the file may hold more, see ``resume.ResultLog``)."""
    return {
        "model": loaded.name,
        "dtype": dtype_name(loaded.dtype),
        "items": len(item_ids),
        "item_ids": list(item_ids),
        "machine": describe_machine(loaded.device),
        "prepacked_linear": loaded.prepacked_linear,
        "exact_bf16": loaded.exact_bf16,
        **extra,
        "methods": summary,
    }


def write_summary(out: Path, document: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(document, indent=2))


def _share(value: float | None, width: int) -> str:
    return f"{value:>{width}.0%}" if value is not None else f"{'-':>{width}}"


def format_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The summary as a text table, the end-to-end speed-up first (the headline)."""
    width = max(10, *(len(method) + 2 for method in summary))
    header = f"{'method':<{width}}{'e2e x':>8}{'TTFT s':>8}{'decode x':>10}{'MAT':>7}" \
             f"{'e2e tok/s':>11}{'decode tok/s':>13}{'prefill acc':>12}{'identical':>11}" \
             f"{'call acc':>10}{'format':>8}{'of oracle':>11}"
    lines = [header, "-" * len(header)]
    for method, m in summary.items():
        lines.append(
            f"{method:<{width}}{m['e2e_speedup']:>7.2f}x{m.get('ttft_s', 0.0):>8.3f}"
            f"{m['decode_speedup']:>9.2f}x{m['mat']:>7.2f}{m['e2e_tokens_per_s']:>11.2f}"
            f"{m['decode_tokens_per_s']:>13.2f}{m.get('prefill_accepted', 0):>12}"
            f"{m['identical_to_ar']:>11.2%}{_share(m.get('call_accuracy'), 10)}"
            f"{_share(m.get('format_adherence'), 8)}{_share(m.get('oracle_fraction'), 11)}"
        )
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "–"


def _milliseconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "–"


def linear_kernels(document: Mapping[str, Any]) -> str:
    """How a ``results.json`` or ``cost_curve.json`` document's fp32 linear layers ran ("" for
    other dtypes, where the stock kernels are the only ones)."""
    if document.get("exact_bf16"):
        return "exact bf16: linear weights prepacked in 64-row tiles, attention row by row"
    if document.get("prepacked_linear"):
        return "linear weights prepacked for oneDNN"
    rows = document.get("packed_rows")  # documents before 2026-12-02: MKL packs per row count
    if rows:
        return f"linear weights packed for {'/'.join(map(str, rows))} rows (MKL)"
    return "stock linear kernels" if document.get("dtype") == "fp32" else ""


def format_markdown(document: Mapping[str, Any]) -> str:
    """A ``results.json`` document as a Markdown table (as the benchmark pages quote it)."""
    kernels = linear_kernels(document)
    lines = [f"{document['model']} {document['dtype']}, {document['items']} items of "
             f"`{document.get('data', '?')}`, draft budget {document.get('draft_budget', '?')}"
             f"{', ' + kernels if kernels else ''}; "
             f"{document['machine']}", "",
             "| method | e2e × | TTFT s | decode × | MAT | e2e tok/s | decode tok/s "
             "| prefill-accepted tokens | identical to ar "
             "| call accuracy | format adherence | of oracle (e2e) | draft ms / step "
             "| verify ms / step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for method, m in document["methods"].items():
        lines.append(f"| {method} | {m['e2e_speedup']:.2f} | {m.get('ttft_s', 0.0):.3f} | "
                     f"{m['decode_speedup']:.2f} | {m['mat']:.2f} | {m['e2e_tokens_per_s']:.2f} | "
                     f"{m['decode_tokens_per_s']:.2f} | {m.get('prefill_accepted', 0)} | "
                     f"{m['identical_to_ar']:.0%} | {_cell(m.get('call_accuracy'))} | "
                     f"{_cell(m.get('format_adherence'))} | {_cell(m.get('oracle_fraction'))} | "
                     f"{_milliseconds(m.get('draft_ms_per_step'))} | "
                     f"{_milliseconds(m.get('verify_ms_per_step'))} |")
    return "\n".join(lines)


def build_engines(loaded: LoadedModel, methods: Sequence[str],
                  fixed_budget: int | None = None, draft_at_prefill: bool = True,
                  cost: CostModel | None = None) -> dict[str, Engine]:
    """One engine per method over the same model (``registry.build_engine``, as a replica
    builds its own), each with a budget of its own (sized to ``cost``, by default this
    machine's cached cost curve, or a fixed node cap): what one method's drafts taught a budget
    about a draft source must not steer another method's trees."""
    target = TargetModel(loaded.model)
    if fixed_budget is not None:
        cost = None
    elif cost is None:
        cost = cached_cost_model(loaded, target=target)
    return {method: build_engine(loaded, split_budget(method)[1] or fixed_budget, cost,
                                 draft_at_prefill, target=target)
            for method in methods}


def offered_tools(item: BenchItem) -> frozenset[str]:
    """The tools ``item`` offers: the only ones whose calls its output teaches the library."""
    return frozenset(item.tools.names) if item.tools is not None else frozenset()
