"""The speculative decoding engine: propose → verify → commit → observe, for any number of
requests at once.

A request's decoding is a ``DecodeJob`` (``toolspec.job``); ``Engine.step`` runs one step of
many jobs: each proposes its draft tree, the budget chooses what of every tree the forward
verifies (one objective for the batch), one ragged forward runs every job's rows (trees,
decoding steps, prompt chunks), and each job walks its tree, commits and tells its drafter.
One request is the batch of one (``stream``, ``generate``): plain autoregressive decoding is
the same loop with a drafter that proposes nothing, so both run through the same model
wrapper, cache and token chooser and their timings compare like with like.

The first draft tree rides on the prefill forward (rooted at the prompt's last token): its
accepted tokens arrive with the first token, and the request needs one forward fewer. A
``GenerationParams.constraint`` (a compiled tool-call grammar) makes every choice a masked one,
in speculative and plain decoding alike (see ``grammar_masks``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.budget import DraftBudget, FixedBudget
from toolspec.drafters.base import DraftRequest, Drafter, NoDrafter
from toolspec.formats import CallFormat
# The data types of a generation live in ``toolspec.generation``; importable from here too.
from toolspec.generation import (Generation, GenerationParams, KVPrefix, PrefixMismatchError,
                                 StepEvent, StepStats)
from toolspec.job import DecodeJob, Verified
from toolspec.output import RequestOutput
from toolspec.target_model import TargetModel
from toolspec.tools import ToolSet

T = TypeVar("T")

__all__ = ["Engine", "Generation", "GenerationParams", "KVPrefix", "PrefixMismatchError",
           "StepEvent", "StepOutcome", "StepReport", "StepStats", "default_stop_token_ids"]


@dataclass(frozen=True)
class StepReport:
    """What one ``Engine.step`` ran: jobs in the forward, their rows by kind, and its time."""

    jobs: int
    prompt_rows: int  # rows of prompts (chunks, and the prompt ahead of a first tree)
    decode_rows: int  # roots and draft-tree nodes of decoding steps
    forward_s: float
    step_s: float


@dataclass(frozen=True)
class StepOutcome:
    """One job's result of a step: its event, or the exception that failed it (the job is
    then closed; the other jobs of the step go on)."""

    event: StepEvent | None = None
    error: Exception | None = None


class Engine:
    """Generates with a target model and any drafter, for one request or many at once.

    ``budget`` decides how much of each draft tree is verified: an int caps the nodes (the
    forward runs over at most budget + 1 tokens); a ``CostAwareBudget`` sizes each tree to the
    measured cost curve. ``draft_at_prefill``: verify a first tree in the prefill forward (off:
    the prefill chooses one token, as plain decoding does). Mutates: the budget's acceptance
    statistics, across generations. ``prefill_chunk_tokens`` (0: off): a longer prompt is
    prefilled that many tokens per forward, ``stream`` yielding an empty event after each
    chunk, and ``step`` running other jobs' steps beside it.
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
        # The latest step's report (diagnostics; None when it ran no forward).
        self.last_step: StepReport | None = None
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
        job = self.start(prompt_ids, drafter, params, tools, call_format, conversation, tenant,
                         prefix, keep_kv)
        try:
            while not job.done:
                outcome = self.step([job])[0]
                if outcome.error is not None:
                    raise outcome.error
                yield outcome.event
        finally:
            job.close()  # also when the consumer leaves early

    def start(
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
    ) -> DecodeJob:
        """A job for ``prompt_ids`` (arguments as ``stream``), run by ``step``. Starts its
        drafter; raises PrefixMismatchError for a ``prefix`` that does not fit."""
        output = RequestOutput(self.tokenizer, call_format)  # the job appends, the drafter reads
        request = DraftRequest(tuple(prompt_ids), tools, call_format, conversation, tenant, output)
        return DecodeJob(self.model, self.tokenizer, self.stop_token_ids, drafter or NoDrafter(),
                         params, request, self.budget.max_nodes, self.draft_at_prefill, prefix,
                         keep_kv)

    def step(self, jobs: Sequence[DecodeJob], prefill_rows: int | None = None
             ) -> list[StepOutcome]:
        """One step of every job in one forward: propose → verify → commit → observe.

        Prompts are prefilled ``prefill_rows`` rows per step in all (default: the engine's
        ``prefill_chunk_tokens`` for each prompt; 0: no limit), in the order of ``jobs``: a job
        whose prompt gets no rows this step sits it out (its outcome is None). A job that
        fails (its drafter or its grammar raises) is closed and its outcome holds the error;
        the others go on. Mutates: the jobs, their caches, the budget's statistics.
        """
        began = time.perf_counter()
        self.last_step = None
        outcomes: list[StepOutcome | None] = [None] * len(jobs)
        chunks = self._prompt_rows(jobs, prefill_rows)
        drafting = [i for i, chunk in enumerate(chunks) if chunk is None]
        proposals = {i: _guarded(outcomes, i, jobs[i], jobs[i].propose) for i in drafting}
        ready = [i for i in drafting if outcomes[i] is None]
        trees = dict(zip(ready, self.budget.select_batch([proposals[i] for i in ready])))
        running = ready + [i for i, chunk in enumerate(chunks) if chunk]
        if not running:
            return outcomes
        clock = time.perf_counter()
        rows = [jobs[i].rows(trees.get(i), chunks[i]) for i in running]
        try:
            logits = self.model.forward(rows)
        except Exception as error:  # the forward itself failed: every job in it fails
            for i in running:
                _fail(outcomes, i, jobs[i], error)
            return outcomes
        forward_s = time.perf_counter() - clock
        verified: list[Verified] = []
        for i, job_logits in zip(running, logits):
            result = _guarded(outcomes, i, jobs[i], jobs[i].advance, job_logits, forward_s)
            if result is not None:
                outcomes[i] = StepOutcome(result[0])
                if result[1] is not None:
                    verified.append(result[1])
        self.budget.observe_batch(verified)
        prompt_rows = sum(len(r.pending) - r.logits for r in rows)  # a root is no prompt row
        self.last_step = StepReport(len(running), prompt_rows,
                                    sum(r.rows for r in rows) - prompt_rows, forward_s,
                                    time.perf_counter() - began)
        return outcomes

    def run(self, jobs: Sequence[DecodeJob], prefill_rows: int | None = None
            ) -> list[Generation | Exception]:
        """Step every job to its end, all unfinished ones in each forward; per job its
        ``Generation`` or the exception that failed it. Mutates: as ``step``."""
        results: list[Generation | Exception | None] = [None] * len(jobs)
        active = list(range(len(jobs)))
        while active:
            outcomes = self.step([jobs[i] for i in active], prefill_rows)
            for i, outcome in zip(active, outcomes):
                if outcome is not None and outcome.error is not None:
                    results[i] = outcome.error
                elif outcome is not None and outcome.event.generation is not None:
                    results[i] = outcome.event.generation
            active = [i for i in active if results[i] is None]
        return results  # type: ignore[return-value]

    def _prompt_rows(self, jobs: Sequence[DecodeJob], prefill_rows: int | None
                     ) -> list[int | None]:
        """Per job: the prompt chunk it runs this step (0: it sits the step out), or None when
        it verifies a tree — it is decoding, or the rest of its prompt fits (the tree then
        rides on the prompt's last forward)."""
        per_job = self.prefill_chunk_tokens or None
        left = prefill_rows or None  # rows this step may still give to prompts (None: any)
        chunks: list[int | None] = [None] * len(jobs)
        # Shortest prompt first: a short request's first token is never queued behind a long
        # prompt's chunks (the long one takes what is left, every step).
        waiting = sorted((i for i, job in enumerate(jobs) if job.prefilling),
                         key=lambda i: jobs[i].prompt_rows)
        for i in waiting:
            rows = jobs[i].prompt_rows
            allowed = min((limit for limit in (per_job, left) if limit is not None),
                          default=None)
            if allowed is not None and rows > allowed:
                chunks[i] = min(allowed, rows - 1)
                rows = chunks[i]
            if left is not None:
                left = max(0, left - rows)
        return chunks


def _guarded(outcomes: list[StepOutcome | None], index: int, job: DecodeJob,
             call: Callable[..., T], *args: Any) -> T | None:
    """``call(*args)``; an exception fails ``job`` (see ``_fail``) and gives None."""
    try:
        return call(*args)
    except Exception as error:  # noqa: BLE001 - one request's failure is its own
        _fail(outcomes, index, job, error)
        return None


def _fail(outcomes: list[StepOutcome | None], index: int, job: DecodeJob,
          error: Exception) -> None:
    job.close()
    outcomes[index] = StepOutcome(error=error)


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
