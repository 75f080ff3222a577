"""What a generation is asked for and what it gives: parameters, per-step statistics, the
finished ``Generation``, the events of a stream, and KV prefixes carried between requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from transformers import DynamicCache

from toolspec.formats import ToolCall
from toolspec.output import CallSpan
from toolspec.sampling import SamplingParams, TokenChooser
from toolspec.stopping import FinishReason

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
    # The well-formed calls in ``text``, as the request's output parse found them.
    calls: tuple[ToolCall, ...] = ()
    # Prompt tokens whose keys and values came from a prefix cache (not computed).
    cached_tokens: int = 0

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
    def decode_rows(self) -> int:
        """Forward rows this request's decoding ran: each step's root and draft nodes, and the
        nodes of the tree that rode on the prefill (its prompt rows are the prompt's)."""
        riding = self.prefill_step.nodes if self.prefill_step is not None else 0
        return riding + sum(step.nodes + 1 for step in self.steps)

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
    """A cache holding exactly the keys and values of ``tokens``, a prompt's first tokens, that
    a job starts from (the simulator's replay cache; served requests take prompt blocks from
    the engine's prefix cache instead)."""

    tokens: tuple[int, ...]
    cache: DynamicCache


class PrefixMismatchError(ValueError):
    """A KVPrefix that does not fit the prompt it was offered for."""


@dataclass(frozen=True)
class StepEvent:
    """What one step of ``Engine.stream`` added to the output.

    The first event holds what the prefill forward chose (the first token, and the first draft
    tree's accepted tokens; ``stats`` None); every later one a verification step. A prompt
    prefilled in chunks first yields an empty event (no tokens, ``stats`` None) per chunk.
    ``text`` is the new visible text (see ``TextDeltas``); ``calls``, where the output's calls
    lie in the whole output text so far (its parse: spans may reach past the visible text).
    The last event carries the finished ``generation``.
    """

    tokens: tuple[int, ...]
    text: str
    stats: StepStats | None
    generation: Generation | None = None
    calls: tuple[CallSpan, ...] = ()
