"""Offline simulator: replay known outputs through a drafter, with no model.

The replay runs the engine's own decode loop (``DecodeJob`` and ``Engine.step``: the same
budget, acceptance walk, stop checks and output parse as serving), with a "model" that accepts
a draft token iff it equals the known next token, so a run over a data set takes seconds and
reports what a drafter would achieve: MAT, how many tokens of each tool-call state (tool name,
parameter name, value, ...) were accepted from drafts, and acceptance per draft source. Known
outputs are the ground-truth calls rendered in the request's format (plus the end-of-sequence
token), or outputs recorded by ``toolspec bench`` (``items.jsonl``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.datasets import BenchItem
from toolspec.calls.formats import DEFAULT_STYLE, CallFormat, CallState, ToolCall
from toolspec.calls.output import RequestOutput
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.core.budget import CostModel, DraftBudget
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.core.engine import Engine
from toolspec.core.forward import SequenceRows
from toolspec.core.generation import GenerationParams, KVPrefix
from toolspec.core.job import DecodeJob
from toolspec.library import CallLibrary
from toolspec.model.target_model import CacheOperations


@dataclass(frozen=True)
class SimTarget:
    id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    request: DraftRequest


def reference_targets(tokenizer: PreTrainedTokenizerBase, items: Iterable[BenchItem],
                      call_format: CallFormat | None = None) -> list[SimTarget]:
    """Each item's ground-truth calls rendered in its format, then end-of-sequence."""
    targets = []
    for item in items:
        prompt, item_format = chat_prompt(tokenizer, item.messages, item.openai_tools, call_format)
        calls = [ToolCall(c["name"], c["arguments"]) for c in item.reference_calls]
        text = item_format.render(calls, DEFAULT_STYLE)
        output = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        targets.append(_target(item, prompt, output, item_format))
    return targets


def recorded_targets(tokenizer: PreTrainedTokenizerBase, items: Iterable[BenchItem],
                     items_jsonl: Path, method: str = "ar",
                     call_format: CallFormat | None = None) -> list[SimTarget]:
    """The outputs ``toolspec bench`` recorded for ``method``, matched to items by id."""
    recorded = {}
    for line in Path(items_jsonl).read_text().splitlines():
        row = json.loads(line)
        if row["method"] == method:
            recorded[row["item"]] = row["tokens"]
    targets = []
    for item in items:
        if item.id in recorded:
            prompt, item_format = chat_prompt(tokenizer, item.messages, item.openai_tools,
                                              call_format)
            targets.append(_target(item, prompt, recorded[item.id], item_format))
    return targets


def _target(item: BenchItem, prompt: list[int], output: Sequence[int],
            call_format: CallFormat) -> SimTarget:
    request = DraftRequest(tuple(prompt), item.tools, call_format,
                           conversation_text(item.messages))
    return SimTarget(item.id, tuple(prompt), tuple(output), request)


def token_states(tokenizer: PreTrainedTokenizerBase, output: Sequence[int],
                 call_format: CallFormat) -> list[CallState]:
    """The call state in which each output token is written (the state before it)."""
    states = []
    for position in range(len(output)):
        scanner = call_format.scanner()
        scanner.feed(tokenizer.decode(output[:position],
                                      skip_special_tokens=False).rstrip("\ufffd"))
        states.append(scanner.state)
    return states


@dataclass(frozen=True)
class ItemSim:
    """One replayed output: its steps and tokens, and the library's size when it began."""

    id: str
    steps: int
    emitted: int
    library_calls: int | None


@dataclass(frozen=True)
class StepEnd:
    """Where a verification step stopped short of the known output: the token the tree lacked.

    ``proposed`` counts the tokens the drafter's whole proposal (before the budget chose what to
    verify) would have had accepted: more than ``accepted`` means the budget cut the right
    branch; equal means the drafter never proposed the token, either guessing others
    (``alternatives`` > 0) or proposing nothing further (it ran out there)."""

    item: str
    position: int  # of the missed token in the output
    state: str  # the call state the missed token is written in
    token: int  # the missed token
    accepted: int  # draft tokens the verified tree had accepted in this step
    proposed: int  # ... the drafter's whole proposal would have had accepted
    alternatives: int  # tokens the proposal offered where its accepted path ends
    nodes: int  # draft nodes verified

    @property
    def cause(self) -> str:
        """``cut`` by the budget; the drafter proposed ``other`` tokens; or it ``ran_out``."""
        if self.proposed > self.accepted:
            return "cut"
        return "other" if self.alternatives else "ran_out"


@dataclass
class SimReport:
    items: int = 0
    steps: int = 0  # verification forwards (the prefill's when it carried a tree)
    emitted: int = 0  # tokens those forwards emitted
    decode_tokens: int = 0  # tokens after each item's first forward (what decoding steps deliver)
    tokens_by_state: Counter[str] = field(default_factory=Counter)
    drafted_by_state: Counter[str] = field(default_factory=Counter)
    proposed_by_source: Counter[str] = field(default_factory=Counter)
    accepted_by_source: Counter[str] = field(default_factory=Counter)
    nodes_verified: int = 0
    forward_cost: float = 0.0  # verification forwards, in units of one plain decoding step
    drafting_s: float = 0.0  # wall time in the drafter and the budget (start to stop)
    per_item: list[ItemSim] = field(default_factory=list)
    step_ends: list[StepEnd] = field(default_factory=list)

    @property
    def mat(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def drafting_ms_per_step(self) -> float:
        """Drafting time per verification step, request start and stop included (this CPU)."""
        return 1000 * self.drafting_s / self.steps if self.steps else 0.0

    @property
    def estimated_speedup(self) -> float | None:
        """Decode speed-up over plain decoding predicted by the cost curve: decode tokens per
        unit of decode-phase forward cost (drafting time and overheads not counted; a tree riding
        on the prefill costs prefill time, not decode time); None without a cost curve."""
        return self.decode_tokens / self.forward_cost if self.forward_cost else None

    def as_dict(self) -> dict:
        return {
            "items": self.items,
            "steps": self.steps,
            "tokens": self.emitted,
            "mat": self.mat,
            "mean_nodes_per_step": self.nodes_verified / self.steps if self.steps else 0.0,
            "drafting_ms_per_step": self.drafting_ms_per_step,
            "estimated_speedup": self.estimated_speedup,
            "acceptance_by_state": {
                state: {"tokens": count, "drafted": self.drafted_by_state[state],
                        "fraction": self.drafted_by_state[state] / count}
                for state, count in sorted(self.tokens_by_state.items())
            },
            "acceptance_by_source": {
                source: {"proposed": count, "accepted": self.accepted_by_source[source],
                         "rate": self.accepted_by_source[source] / count}
                for source, count in sorted(self.proposed_by_source.items())
            },
            "per_item": [vars(item) for item in self.per_item],
            "step_ends": step_end_counts(self.step_ends),
        }


@contextmanager
def _drafting(report: SimReport) -> Iterator[None]:
    """Adds the time spent inside the block to ``report.drafting_s``."""
    clock = time.perf_counter()
    try:
        yield
    finally:
        report.drafting_s += time.perf_counter() - clock


class ReplayCache:
    """A KV cache without keys and values, for a sequence whose every next token is known
    (``truth``: prompt + recorded output): it keeps only its length, which is all the decode
    loop's commit and truncation change. Mutates: its length."""

    layers: tuple = ()  # no keys or values for ``commit_path`` to move

    def __init__(self, truth: Sequence[int]) -> None:
        self.truth = tuple(truth)
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        self.length = self.length + length if length < 0 else min(self.length, length)


class ReplayModel(CacheOperations):
    """The target model of a replay: each row "predicts" the known token after its position
    (-1 past the known output), so a draft token is accepted iff it is the known next token.
    ``forward`` takes the engine's rows as ``TargetModel.forward`` does, over ``ReplayCache``s.
    Mutates: the caches (they grow by the rows run)."""

    def forward(self, batch: Sequence[SequenceRows]) -> list[list[int] | None]:
        predictions: list[list[int] | None] = []
        for rows in batch:
            cache: ReplayCache = rows.cache  # type: ignore[assignment]
            root = cache.get_seq_length() + len(rows.pending) - 1
            positions = (root, *(root + depth for depth in rows.tree.depths))
            truth = cache.truth
            predictions.append([truth[p + 1] if p + 1 < len(truth) else -1 for p in positions]
                               if rows.logits else None)
            cache.length += rows.rows
        return predictions


class ReplayChooser:
    """Chooses the known next token of each row (``ReplayModel``'s predictions)."""

    def __init__(self) -> None:
        self._predicted: Sequence[int] = ()

    def bind(self, predicted: Sequence[int]) -> None:
        self._predicted = predicted

    def choose(self, row: int) -> int:
        return self._predicted[row]


def _replay_job(engine: Engine, target: SimTarget, drafter: Drafter,
                tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                draft_at_prefill: bool) -> DecodeJob:
    """The decode loop's job for ``target``, its model's choices replayed. It ends where the
    recorded output ends: at its end token (drafting room bounded by ``max_new_tokens``, as
    the engine's), or, for an output cut without one, at its length."""
    output = target.output_ids
    end_tokens = {*getattr(tokenizer, "all_special_ids", ()), tokenizer.eos_token_id}
    ends_itself = output[-1] in end_tokens and output[-1] not in output[:-1]
    stop = frozenset({output[-1]}) if ends_itself else frozenset()
    limit = max(max_new_tokens, len(output)) if ends_itself else len(output)
    request = replace(target.request, output=RequestOutput(tokenizer, target.request.call_format))
    return DecodeJob(engine.model, tokenizer, stop, drafter, GenerationParams(limit), request,
                     engine.budget.max_nodes, draft_at_prefill,
                     KVPrefix((), ReplayCache((*target.prompt_ids, *output))),
                     chooser=ReplayChooser())


def simulate(
    drafter: Drafter,
    targets: Iterable[SimTarget],
    budget: DraftBudget,
    tokenizer: PreTrainedTokenizerBase,
    cost: CostModel | None = None,
    max_new_tokens: int = 256,
    library: CallLibrary | None = None,
    tenant: str = "default",
    draft_at_prefill: bool = True,
) -> SimReport:
    """Replay every target through ``drafter`` in the engine's own decode loop (``DecodeJob``
    and ``Engine.step``, with ``ReplayModel`` for the model): the first tree rides on the
    prefill (``draft_at_prefill``), rooted at the prompt's last token.

    With a ``cost`` model the report also predicts the decode speed-up. With a ``library``, each
    target's calls are added to it after the target (a cold start filled in order). Mutates:
    ``drafter``, ``budget`` and ``library``."""
    report = SimReport()
    engine = Engine(ReplayModel(), tokenizer, budget, stop_token_ids=(),  # type: ignore[arg-type]
                    draft_at_prefill=draft_at_prefill)
    for target in targets:
        output = target.output_ids
        if not output:
            continue
        states = token_states(tokenizer, output, target.request.call_format) \
            if target.request.call_format is not None else [CallState.TEXT] * len(output)
        steps_before, emitted_before = report.steps, report.emitted
        library_calls = library.stats().calls if library is not None else None
        with _drafting(report):
            job = _replay_job(engine, target, drafter, tokenizer, max_new_tokens,
                              draft_at_prefill)
        position = 0
        while not job.done:
            with _drafting(report):
                outcome = engine.step([job]).outcomes[0]
            if outcome.error is not None:
                raise outcome.error
            prompt_forward = position == 0  # the forward that delivers the first tokens
            acceptance = job.acceptance
            tree = acceptance.tree if acceptance is not None else DraftTree()
            accepted = acceptance.accepted if acceptance is not None else ()
            verifies = bool(tree) or not prompt_forward  # a plain prefill is no verification
            if verifies and position + len(accepted) + 1 < len(output):  # ended short of it
                missed = position + len(accepted)
                reach = job.proposal.path_along(output[position:])
                report.step_ends.append(StepEnd(
                    target.id, missed, states[missed].value, output[missed], len(accepted),
                    len(reach), job.proposal.child_count(reach[-1] if reach else ROOT),
                    len(tree)))
            emitted_count = min(len(outcome.event.tokens), len(output) - position)
            if not prompt_forward:  # the prompt's forward delivers prefill's tokens, tree or not
                report.decode_tokens += emitted_count
            if not prompt_forward and cost is not None:
                report.forward_cost += cost.cost(len(tree) + 1)
            position += emitted_count
            if prompt_forward and not tree:  # plain prefill: not a verification
                continue
            report.steps += 1
            report.nodes_verified += len(tree)
            report.proposed_by_source.update(tree.sources)
            report.accepted_by_source.update(tree.sources[n] for n in accepted)
            start = position - emitted_count
            for offset in range(min(len(accepted), emitted_count)):
                report.drafted_by_state[states[start + offset].value] += 1
            for offset in range(emitted_count):
                report.tokens_by_state[states[start + offset].value] += 1
            report.emitted += emitted_count
        report.items += 1
        report.per_item.append(ItemSim(target.id, report.steps - steps_before,
                                       report.emitted - emitted_before, library_calls))
        if library is not None and target.request.call_format is not None:
            offered = target.request.tools.names if target.request.tools else ()
            library.remember(job.output.parse.calls(), offered, tenant)
    return report


def write_step_ends(path: Path, ends: Iterable[StepEnd], targets: Sequence[SimTarget],
                    tokenizer: PreTrainedTokenizerBase, context_chars: int = 60) -> None:
    """``ends`` as JSON lines, each with the missed token's text and the ``context_chars`` of
    output before it (what a person reads to see why the drafter missed)."""
    outputs = {target.id: target.output_ids for target in targets}
    with open(path, "w") as handle:
        for end in ends:
            before = tokenizer.decode(outputs[end.item][: end.position])
            handle.write(json.dumps({**vars(end), "cause": end.cause,
                                     "text": tokenizer.decode([end.token]),
                                     "before": before[-context_chars:]}) + "\n")


def step_end_counts(ends: Iterable[StepEnd]) -> dict[str, dict[str, int]]:
    """Per call state of the missed token: steps that ended there, and how many of them for
    each ``StepEnd.cause``."""
    counts: dict[str, dict[str, int]] = {}
    for end in ends:
        row = counts.setdefault(end.state, {"steps": 0, "cut": 0, "other": 0, "ran_out": 0})
        row["steps"] += 1
        row[end.cause] += 1
    return dict(sorted(counts.items(), key=lambda entry: -entry[1]["steps"]))


def format_report(report: SimReport) -> str:
    data = report.as_dict()
    speedup = report.estimated_speedup
    lines = [f"{data['items']} items, {data['tokens']} tokens, {data['steps']} steps: "
             f"MAT {data['mat']:.2f}, {data['mean_nodes_per_step']:.1f} draft nodes per step, "
             f"drafting {data['drafting_ms_per_step']:.2f} ms per step"
             + (f", estimated decode speed-up {speedup:.2f}x" if speedup else ""), "",
             f"{'state':<16}{'tokens':>8}{'drafted':>9}{'share':>8}"]
    for state, row in data["acceptance_by_state"].items():
        lines.append(f"{state:<16}{row['tokens']:>8}{row['drafted']:>9}{row['fraction']:>8.1%}")
    lines += ["", f"{'source':<16}{'proposed':>9}{'accepted':>9}{'rate':>8}"]
    for source, row in data["acceptance_by_source"].items():
        lines.append(f"{source:<16}{row['proposed']:>9}{row['accepted']:>9}{row['rate']:>8.1%}")
    lines += ["", "steps that ended before the output, by the missed token's call state: the "
              "budget cut it, the drafter guessed other tokens, or it had nothing further",
              f"{'state':<16}{'steps':>8}{'cut':>8}{'other':>8}{'ran out':>9}"]
    for state, row in data["step_ends"].items():
        lines.append(f"{state:<16}{row['steps']:>8}{row['cut']:>8}{row['other']:>8}"
                     f"{row['ran_out']:>9}")
    return "\n".join(lines)
