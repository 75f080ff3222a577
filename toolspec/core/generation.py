"""What a generation is asked for and what it gives: parameters, per-step statistics, the
finished ``Generation``, the events of a stream, KV prefixes carried between requests, what a
step of many jobs returns, and what observers of the loop are told."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from toolspec.calls.formats import ToolCall
from toolspec.calls.output import CallSpan
from toolspec.core.draft_tree import DraftTree
from toolspec.core.sampling import SamplingParams, TokenChooser
from toolspec.core.stopping import FinishReason

if TYPE_CHECKING:  # a type only: unconstrained decoding never loads llguidance
    from toolspec.core.grammar_masks import GrammarConstraint


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
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


@dataclass(frozen=True)
class StepReport:
    """What one ``Engine.step`` ran: jobs in the forward, their rows by kind, and its time."""

    jobs: int
    prompt_rows: int  # rows of prompts (chunks, and the prompt ahead of a first tree)
    decode_rows: int  # roots and draft-tree nodes of decoding steps
    forward_s: float
    step_s: float
    cached_tokens: int = 0  # prompt tokens taken from the prefix cache instead of computed
    jobs_sitting_out: int = 0  # no rows left for their prompt, or a block another computes


@dataclass(frozen=True)
class StepOutcome:
    """One job's result of a step: its event, or the exception that failed it (the job is
    then closed; the other jobs of the step go on)."""

    event: StepEvent | None = None
    error: Exception | None = None


@dataclass(frozen=True)
class StepResult:
    """What one ``Engine.step`` did: per job (in the order given) its outcome, None for a job
    that sat the step out; and the forward's report, None when no forward ran."""

    outcomes: list[StepOutcome | None]
    report: StepReport | None = None


@dataclass(frozen=True)
class Verification:
    """One acceptance walk of a job, for what watches the loop from outside (``StepObserver``):
    the ``root`` token fed to the model, the ``tree`` below it, the logit rows of the accepted
    path (``path_rows``: the root's row, then each accepted node's) and the tokens the step
    emitted (cut at a stop)."""

    root: int
    tree: DraftTree
    path_rows: tuple[int, ...]
    emitted: tuple[int, ...]


class StepObserver(Protocol):
    """Watches one job's verifications from outside the loop: the engine tells it each walk
    with the forward's logits for the job's rows (``[len(tree) + 1, vocab]``). What measures
    (a benchmark's logit margins) or learns from the model's candidates (Token Recycling)
    lives here, not in the job."""

    def verified(self, verification: Verification, logits: torch.Tensor) -> None:
        """Mutates: the observer only; never the logits."""
