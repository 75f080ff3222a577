"""The speculative decoding engine: propose → verify → commit → observe, from the prefill on.

Plain autoregressive decoding is the same loop with a drafter that proposes nothing, so both run
through the same model wrapper, cache and token chooser and their timings compare like with like.
The first draft tree rides on the prefill forward (rooted at the prompt's last token): its
accepted tokens arrive with the first token, and the request needs one forward fewer.
A ``GenerationParams.constraint`` (a compiled tool-call grammar) makes every choice a masked one,
in speculative and plain decoding alike (see ``grammar_masks``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.budget import DraftBudget, FixedBudget
from toolspec.draft_tree import DraftTree
from toolspec.drafters.base import DraftRequest, Drafter, NoDrafter
from toolspec.formats import CallFormat
from toolspec.logit_feedback import feed_top_k, logits_observer
from toolspec.sampling import SamplingParams, TokenChooser
from toolspec.stopping import FinishReason, StopScanner, cut_at_stop_string
from toolspec.target_model import TargetModel, commit_path, truncate_cache
from toolspec.text_stream import TextDeltas
from toolspec.tools import ToolSet
from toolspec.verify import Verification, verify

if TYPE_CHECKING:  # a type only: unconstrained decoding never loads llguidance
    from toolspec.grammar_masks import GrammarConstraint


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    # Record the top-1 minus top-2 logit margin behind every emitted token (diagnostics).
    record_margins: bool = False
    # Grammar-constrained decoding: every token is chosen from the grammar-masked logits.
    constraint: GrammarConstraint | None = None

    def chooser(self) -> TokenChooser:
        """A fresh chooser for one generation (constrained when ``constraint`` is set)."""
        if self.constraint is None:
            return TokenChooser(self.sampling)
        return self.constraint.chooser(self.sampling)


@dataclass(frozen=True)
class StepStats:
    """One verification step."""

    nodes: int  # draft nodes proposed (the root not counted)
    accepted: int  # draft tokens accepted (the bonus not counted)
    emitted: int  # tokens this step added to the output (accepted + bonus, after stop cuts)
    draft_s: float
    verify_s: float
    commit_s: float
    accepted_by_source: Mapping[str, int]


@dataclass(frozen=True)
class Generation:
    prompt_tokens: int
    tokens: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    prefill_s: float  # the prompt's forward (with the first tree, if any): time to first token
    decode_s: float  # everything after that
    steps: tuple[StepStats, ...]  # the verification steps after the prefill
    margins: tuple[float, ...] | None = None  # aligned with ``tokens`` when recorded
    # The draft tree verified in the prefill forward; None when none was drafted there.
    prefill_step: StepStats | None = None

    @property
    def decode_tokens(self) -> int:
        """Every token but the first: those the decode phase delivered (the first tree's accepted
        tokens arrive with the first token, at no decode time: time per output token as serving
        benchmarks count it, ``decode_s / decode_tokens``)."""
        first = self.prefill_step.emitted - 1 if self.prefill_step is not None else 0
        return first + sum(step.emitted for step in self.steps)

    @property
    def verifications(self) -> tuple[StepStats, ...]:
        """Every forward that verified a draft tree or followed one: the prefill's (when it
        carried a tree), then the steps."""
        return (self.prefill_step, *self.steps) if self.prefill_step is not None else self.steps

    @property
    def mat(self) -> float:
        """Mean tokens committed per verification, bonus included (1.0 for plain decoding)."""
        verifications = self.verifications
        return sum(v.emitted for v in verifications) / len(verifications) if verifications else 0.0

    def accepted_by_source(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for step in self.verifications:
            total.update(step.accepted_by_source)
        return total


@dataclass(frozen=True)
class KVPrefix:
    """A KV cache holding exactly the keys and values of ``tokens`` (a prompt's first tokens):
    what a later request whose prompt starts with ``tokens`` need not prefill again."""

    tokens: tuple[int, ...]
    cache: DynamicCache


class PrefixMismatchError(ValueError):
    """A KVPrefix that does not fit the prompt it was offered for."""


@dataclass(frozen=True)
class StepEvent:
    """What one step of ``Engine.stream`` added to the output.

    The first event holds what the prefill forward chose (the first token, and the first draft
    tree's accepted tokens; ``stats`` None); every later one a verification step. A prompt
    prefilled in chunks first yields an empty event (no tokens, ``stats`` None) per chunk. ``text`` is
    the new visible text (see ``TextDeltas``). The last event carries the finished
    ``generation``.
    """

    tokens: tuple[int, ...]
    text: str
    stats: StepStats | None
    generation: Generation | None = None
    kv: KVPrefix | None = None  # last event of a stream asked to keep it: prompt + output


class Engine:
    """Generates with a target model and any drafter. One sequence at a time.

    ``budget`` decides how much of each draft tree is verified: an int caps the nodes (the
    forward runs over at most budget + 1 tokens); a ``CostAwareBudget`` sizes each tree to the
    measured cost curve. ``draft_at_prefill``: verify a first tree in the prefill forward (off:
    the prefill chooses one token, as plain decoding does). Mutates: the budget's acceptance
    statistics, across generations. ``prefill_chunk_tokens`` (0: off): a longer prompt is
    prefilled that many tokens per forward, ``stream`` yielding an empty event after each
    chunk, so that a scheduler can run other requests' steps in between.
    """

    def __init__(
        self,
        model: TargetModel,
        tokenizer: PreTrainedTokenizerBase,
        budget: DraftBudget | int = 8,
        stop_token_ids: Sequence[int] | None = None,
        draft_at_prefill: bool = True,
        prefill_chunk_tokens: int = 0,
    ) -> None:
        if isinstance(budget, int):
            if budget < 0:
                raise ValueError(f"the draft budget must be >= 0, got {budget}")
            budget = FixedBudget(budget)
        self.model = model
        self.tokenizer = tokenizer
        self.budget = budget
        self.draft_at_prefill = draft_at_prefill
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.stop_token_ids = frozenset(
            stop_token_ids if stop_token_ids is not None else default_stop_token_ids(model, tokenizer)
        )

    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        params: GenerationParams = GenerationParams(),
        tools: ToolSet | None = None,
        call_format: CallFormat | None = None,
        conversation: str = "",
        tenant: str = "default",
    ) -> Generation:
        """Generate after ``prompt_ids``; ``tools``, ``call_format``, ``conversation`` (the
        messages' text) and ``tenant`` (whose past calls may be drafted) inform the drafter."""
        for event in self.stream(prompt_ids, drafter, params, tools, call_format, conversation,
                                 tenant):
            if event.generation is not None:
                return event.generation
        raise AssertionError("Engine.stream ended without a generation")

    def stream(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        params: GenerationParams = GenerationParams(),
        tools: ToolSet | None = None,
        call_format: CallFormat | None = None,
        conversation: str = "",
        tenant: str = "default",
        prefix: KVPrefix | None = None,
        keep_kv: bool = False,
    ) -> Generator[StepEvent, None, None]:
        """``generate`` one step at a time: a ``StepEvent`` per step, the last one carrying the
        ``Generation``. Closing the iterator early ends the request (the drafter is stopped).
        Timings are wall time, so they include any time the consumer held the iterator.

        ``prefix``: a cache of the prompt's first tokens; only the rest is prefilled. Mutates:
        ``prefix.cache`` (it becomes this request's cache). ``keep_kv``: the last event holds
        the cache of prompt + output (for the next turn of a conversation).
        """
        drafter = drafter or NoDrafter()
        try:
            yield from self._decode(prompt_ids, drafter, params, tools, call_format, conversation,
                                    tenant, prefix, keep_kv)
        finally:
            drafter.stop()  # also when the consumer leaves early

    def _decode(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter,
        params: GenerationParams,
        tools: ToolSet | None,
        call_format: CallFormat | None,
        conversation: str,
        tenant: str,
        prefix: KVPrefix | None,
        keep_kv: bool,
    ) -> Generator[StepEvent, None, None]:
        chooser = params.chooser()
        scanner = StopScanner(self.tokenizer, self.stop_token_ids, params.stop, params.max_new_tokens)
        deltas = TextDeltas(self.tokenizer, params.stop)
        cache, reused = self._start_cache(prompt_ids, prefix)

        started = time.perf_counter()
        drafter.start(DraftRequest(tuple(prompt_ids), tools, call_format, conversation, tenant))
        observer = logits_observer(drafter)
        context = list(prompt_ids)
        pending = context[reused:]  # not yet in the cache; the last one roots the next tree
        chunk = self.prefill_chunk_tokens
        while chunk and len(pending) > chunk:
            self.model.prefill(cache, pending[:chunk])
            pending = pending[chunk:]
            yield StepEvent((), "", None)
        generated: list[int] = []
        margins: list[float] | None = [] if params.record_margins else None
        steps: list[StepStats] = []
        prefill_step: StepStats | None = None
        prefill_s = 0.0
        while True:
            at_prefill = not generated
            room = min(self.budget.max_nodes, params.max_new_tokens - len(generated) - 1)
            t0 = time.perf_counter()
            drafting = room > 0 and (self.draft_at_prefill or not at_prefill)
            tree = self.budget.select(drafter.propose(context, room)) if drafting else DraftTree()
            t1 = time.perf_counter()
            base_length = cache.get_seq_length() + len(pending) - 1  # rows before the root's
            result = verify(self.model, cache, pending, tree, chooser)
            t2 = time.perf_counter()
            commit_path(cache, base_length, result.path.rows)
            if drafting:  # a tree verified with more than its root rode on the prompt's forward
                self.budget.observe(tree, result.path.nodes, rides_on_prefill=len(pending) > 1)
            t3 = time.perf_counter()
            emitted = list(result.emitted)
            generated.extend(emitted)
            decision = scanner.scan(generated, len(emitted))
            if decision is not None and decision.keep < len(emitted):
                del generated[len(generated) - len(emitted) + decision.keep :]
                emitted = emitted[: decision.keep]
            if observer is not None:
                feed_top_k(observer, pending[-1], tree, result.logits)
            context.extend(emitted)
            pending = context[-1:]
            drafter.observe(emitted)
            t4 = time.perf_counter()
            if margins is not None:
                margins.extend(_top2_margin(result.logits[list(result.path.rows)])[: len(emitted)])
            stats = _step_stats(tree, result, len(emitted), t1 - t0 + t4 - t3, t2 - t1, t3 - t2)
            if at_prefill:
                prefill_s = time.perf_counter() - started
                prefill_step = stats if len(tree) else None
            else:
                steps.append(stats)
            if decision is not None:
                break
            yield StepEvent(tuple(emitted), deltas.update(generated),
                            None if at_prefill else stats)
        decode_s = time.perf_counter() - started - prefill_s

        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        generation = Generation(
            prompt_tokens=len(prompt_ids),
            tokens=tuple(generated),
            text=cut_at_stop_string(text, decision.stop_string),
            finish_reason=decision.reason,
            prefill_s=prefill_s,
            decode_s=decode_s,
            steps=tuple(steps),
            margins=tuple(margins) if margins is not None else None,
            prefill_step=prefill_step,
        )
        kv = _kv_of(cache, context) if keep_kv else None
        yield StepEvent(tuple(emitted), deltas.finish(generation.text),
                        None if at_prefill else stats, generation, kv)

    def _start_cache(self, prompt_ids: Sequence[int], prefix: KVPrefix | None
                     ) -> tuple[DynamicCache, int]:
        if prefix is None:
            return self.model.new_cache(), 0
        reused = len(prefix.tokens)
        if reused >= len(prompt_ids) or tuple(prompt_ids[:reused]) != prefix.tokens \
                or prefix.cache.get_seq_length() != reused:
            raise PrefixMismatchError(
                f"a KV prefix of {reused} tokens ({prefix.cache.get_seq_length()} cached) must "
                f"be a proper prefix of the {len(prompt_ids)}-token prompt")
        return prefix.cache, reused


def _kv_of(cache: DynamicCache, context: Sequence[int]) -> KVPrefix:
    """``cache`` cut to the context tokens it holds (rows of tokens a stop cut are dropped;
    the last emitted token was never fed)."""
    held = min(cache.get_seq_length(), len(context))
    truncate_cache(cache, held)
    return KVPrefix(tuple(context[:held]), cache)


def _step_stats(
    tree: DraftTree, result: Verification, emitted: int, draft_s: float, verify_s: float,
    commit_s: float,
) -> StepStats:
    accepted = result.path.nodes[:emitted]  # a stop may cut the step short
    return StepStats(
        nodes=len(tree),
        accepted=len(accepted),
        emitted=emitted,
        draft_s=draft_s,
        verify_s=verify_s,
        commit_s=commit_s,
        accepted_by_source=Counter(tree.sources[node] for node in accepted),
    )


def _top2_margin(logits: torch.Tensor) -> list[float]:
    top = torch.topk(logits.float(), 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def default_stop_token_ids(model: TargetModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-sequence ids from the generation config and the tokenizer."""
    ids: set[int] = set()
    configured = getattr(model.model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
