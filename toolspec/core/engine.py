"""The speculative decoding engine: propose → verify → commit → observe, for any number of
requests at once.

A request's decoding is a ``DecodeJob`` (``toolspec.core.job``); ``Engine.step`` runs one step of
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

Prompts: with a ``PrefixCache`` a job first takes the cached blocks its prompt starts with
(at its first step, and again at each step while it prefills: blocks another job computed
meanwhile), and every prompt block a forward computes is inserted at once. Two jobs about to
compute the same block do not both do it: one runs, the other sits the step out and takes the
block next step. A step runs at most ``step_rows`` rows while any job decodes: decoding goes
first, prompt chunks (whole blocks, first come first served) fill what it leaves, at least
one block a step; with nobody decoding, the first prompt runs whole (there is no step to keep
short) and the others wait for it rather than share one long forward.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallFormat
from toolspec.calls.output import RequestOutput
from toolspec.calls.tools import ToolSet
from toolspec.core.batch import BatchDriver
from toolspec.core.budget import DraftBudget, FixedBudget
from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import Drafter, DraftRequest, NoDrafter
from toolspec.core.forward import TargetForward

# The data types of a generation live in ``toolspec.core.generation``; importable from here too.
from toolspec.core.generation import (
    Generation,
    GenerationParams,
    KVPrefix,
    PrefixMismatchError,
    StepEvent,
    StepObserver,
    StepOutcome,
    StepReport,
    StepResult,
    StepStats,
)
from toolspec.core.job import DecodeJob, TreeAcceptance
from toolspec.core.prefix_cache import DEFAULT_BLOCK_TOKENS, PrefixCache, block_keys

T = TypeVar("T")


class RequestContext(TypedDict, total=False):
    """``Engine.start``'s keywords, which ``generate`` and ``stream`` pass on: what informs a
    request's drafter beyond its prompt, and who watches it."""

    tools: ToolSet | None
    call_format: CallFormat | None
    conversation: str
    tenant: str
    observers: Sequence[StepObserver]
logger = logging.getLogger(__name__)

__all__ = ["Engine", "Generation", "GenerationParams", "KVPrefix", "PrefixMismatchError",
           "RequestContext", "StepEvent", "StepOutcome", "StepReport", "StepResult",
           "StepStats", "default_stop_token_ids"]


class Engine:
    """Generates with a target model and any drafter, for one request or many at once.

    ``budget`` decides how much of each draft tree is verified: an int caps the nodes (the
    forward runs over at most budget + 1 tokens); a ``CostAwareBudget`` sizes each tree to the
    measured cost curve. ``draft_at_prefill``: verify a first tree in the prefill forward (off:
    the prefill chooses one token, as plain decoding does). ``step_rows`` (0: no limit): rows
    a forward runs at most; a longer prompt is prefilled in chunks of whole blocks, ``stream``
    yielding an empty event after each chunk, and ``step`` running other jobs' steps beside
    it. ``prefix_cache``: prompt blocks kept across requests (None: every prompt computed).
    Mutates: the budget's acceptance statistics and the prefix cache, across generations.
    """

    def __init__(
        self,
        model: TargetForward,
        tokenizer: PreTrainedTokenizerBase,
        budget: DraftBudget | int = 8,
        stop_token_ids: Sequence[int] | None = None,
        draft_at_prefill: bool = True,
        step_rows: int = 0,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if isinstance(budget, int):
            if budget < 0:
                raise ValueError(f"the draft budget must be >= 0, got {budget}")
            budget = FixedBudget(budget)
        if step_rows < 0:
            raise ValueError(f"step_rows must be >= 0 (0: no limit), got {step_rows}")
        self.model = model
        self.tokenizer = tokenizer
        self.budget = budget
        self.draft_at_prefill = draft_at_prefill
        self.step_rows = step_rows
        # Prompt chunks end on the model's block boundaries: a block is attended whole.
        self.block_tokens = int(getattr(model, "block_tokens", DEFAULT_BLOCK_TOKENS))
        if prefix_cache is not None and prefix_cache.block_tokens != self.block_tokens:
            raise ValueError(f"the prefix cache's blocks ({prefix_cache.block_tokens} tokens) "
                             f"must be the model's ({self.block_tokens})")
        self.prefix_cache = prefix_cache
        self.stop_token_ids = frozenset(
            stop_token_ids if stop_token_ids is not None
            else default_stop_token_ids(model, tokenizer)
        )

    def generate(self, prompt_ids: Sequence[int], drafter: Drafter | None = None,
                 params: GenerationParams = GenerationParams(),
                 **context: Unpack[RequestContext]) -> Generation:
        """Generate after ``prompt_ids`` (arguments as ``start``)."""
        for event in self.stream(prompt_ids, drafter, params, **context):
            if event.generation is not None:
                return event.generation
        raise AssertionError("Engine.stream ended without a generation")

    def stream(self, prompt_ids: Sequence[int], drafter: Drafter | None = None,
               params: GenerationParams = GenerationParams(),
               **context: Unpack[RequestContext]) -> Generator[StepEvent, None, None]:
        """``generate`` one step at a time: a ``StepEvent`` per step, the last one carrying the
        ``Generation``. Closing the iterator early ends the request (the drafter is stopped).
        Timings are wall time, so they include any time the consumer held the iterator.
        """
        job = self.start(prompt_ids, drafter, params, **context)
        try:
            while not job.done:
                outcome = self.step([job]).outcomes[0]
                if outcome.error is not None:
                    raise outcome.error
                yield outcome.event
        finally:
            job.close()  # also when the consumer leaves early

    def start(self, prompt_ids: Sequence[int], drafter: Drafter | None = None,
              params: GenerationParams = GenerationParams(), *, tools: ToolSet | None = None,
              call_format: CallFormat | None = None, conversation: str = "",
              tenant: str = "default", observers: Sequence[StepObserver] = ()) -> DecodeJob:
        """A job for ``prompt_ids``, run by ``step``; starts its drafter (None: plain
        decoding). ``tools``, ``call_format``, ``conversation`` (the messages' text) and
        ``tenant`` (whose past calls may be drafted) inform the drafter (``RequestContext``);
        ``tenant`` also scopes the prompt's blocks in the prefix cache; ``observers`` watch
        each verification."""
        output = RequestOutput(self.tokenizer, call_format)  # the job appends, the drafter reads
        request = DraftRequest(tuple(prompt_ids), tools, call_format, conversation, tenant, output)
        return DecodeJob(self.model, self.tokenizer, self.stop_token_ids, drafter or NoDrafter(),
                         params, request, self.budget.max_nodes, self.draft_at_prefill,
                         observers=observers)

    def step(self, jobs: Sequence[DecodeJob], step_rows: int | None = None) -> StepResult:
        """One step of every job in one forward: propose → verify → commit → observe.

        At most ``step_rows`` rows (default: the engine's ``step_rows``; 0: no limit) while
        any job decodes: decoding jobs' trees first (sized knowing the prompt rows beside
        them), then prompt chunks of whole blocks, in the order of ``jobs``, at least one block
        a step (with no job decoding, the first prompt runs whole); a job whose prompt gets no
        rows — or whose next block another job computes this step — sits it out (its outcome
        is None). A job that fails (its drafter or its grammar raises) is closed and its
        outcome holds the error; the others go on. Returns the outcomes and the forward's
        report. Mutates: the jobs, their caches, the budget's statistics, the prefix cache.
        """
        began = time.perf_counter()
        outcomes: list[StepOutcome | None] = [None] * len(jobs)
        cached = self._take_cached_prompts(jobs)
        plan = self._plan(jobs, self.step_rows if step_rows is None else step_rows, outcomes)
        if not plan.running:
            return StepResult(outcomes)
        # forward → advance (walk, commit, tell the drafter) → learn → store the prompt blocks
        clock = time.perf_counter()
        rows = [jobs[i].rows(plan.trees.get(i), plan.chunks[i]) for i in plan.running]
        try:
            logits = self.model.forward(rows)
        except Exception as error:  # the forward itself failed: every job in it fails
            for i in plan.running:
                _fail(outcomes, i, jobs[i], error)
            return StepResult(outcomes)
        forward_s = time.perf_counter() - clock
        accepted = self._advance(jobs, plan.running, logits, forward_s, outcomes)
        prompt_rows = sum(len(r.pending) - r.logits for r in rows)  # a root is no prompt row
        self.budget.observe_batch(accepted, prompt_rows)
        self._store_computed_prompts([jobs[i] for i, r in zip(plan.running, rows)
                                      if r.prompt and outcomes[i].error is None])
        return StepResult(outcomes, StepReport(len(plan.running), prompt_rows,
                                               sum(r.rows for r in rows) - prompt_rows,
                                               forward_s, time.perf_counter() - began, cached,
                                               plan.jobs_sitting_out))

    def _plan(self, jobs: Sequence[DecodeJob], limit: int,
              outcomes: list[StepOutcome | None]) -> _StepPlan:
        """Which rows the step's forward runs (``step``'s rules; ``limit`` 0: no limit): the
        decoding jobs' trees, sized knowing the prompt rows beside them; the prompt chunks
        in what they leave; then the trees that ride on a prompt's last chunk. A job whose
        drafter fails gets its outcome here. Mutates: the jobs' drafters (they propose)."""
        decoding = [i for i, job in enumerate(jobs) if not job.prefilling]
        prompt_rows_beside = sum(job.prompt_rows for job in jobs if job.prefilling)
        if limit and decoding:
            prompt_rows_beside = min(prompt_rows_beside,
                                     max(self.block_tokens, limit - len(decoding)))
        trees = self._select_trees(jobs, decoding, outcomes, prompt_rows_beside)
        left = None
        if limit and trees:
            used = sum(1 + len(tree) for tree in trees.values())
            left = max(self.block_tokens, limit - used)
        elif limit:  # nobody decodes: the first prompt runs whole (there is no step to keep
            # short), the others wait for it rather than share one long forward
            first = next((job for job in jobs if job.prefilling), None)
            left = max(limit, first.prompt_rows if first is not None else 0)
        chunks = self._prompt_chunks(jobs, left)
        riding = [i for i, job in enumerate(jobs) if job.prefilling and chunks[i] is None]
        other = sum(1 + len(tree) for tree in trees.values()) + sum(filter(None, chunks)) + \
            sum(jobs[i].prompt_rows for i in riding)
        trees.update(self._select_trees(jobs, riding, outcomes, other))
        running = sorted([*trees, *(i for i, chunk in enumerate(chunks) if chunk)])
        return _StepPlan(trees, chunks, running, sum(1 for chunk in chunks if chunk == 0))

    def _advance(self, jobs: Sequence[DecodeJob], running: Sequence[int],
                 logits: Sequence[torch.Tensor], forward_s: float,
                 outcomes: list[StepOutcome | None]) -> list[TreeAcceptance]:
        """Each running job walks its rows' logits, commits what it accepted and tells its
        drafter (and its observers); returns what the trees' acceptance teaches the budget.
        A job that fails gets its outcome, the others go on. Mutates: the jobs, ``outcomes``."""
        accepted: list[TreeAcceptance] = []
        for i, job_logits in zip(running, logits):
            result = _guarded(outcomes, i, jobs[i], jobs[i].advance, job_logits, forward_s)
            if result is not None and jobs[i].observers and jobs[i].verification is not None:
                _guarded(outcomes, i, jobs[i], _tell_observers, jobs[i], job_logits)
                if outcomes[i] is not None:  # an observer failed the job
                    continue
            if result is not None:
                outcomes[i] = StepOutcome(result[0])
                if result[1] is not None:
                    accepted.append(result[1])
        return accepted

    def run(self, jobs: Sequence[DecodeJob], step_rows: int | None = None
            ) -> list[Generation | Exception]:
        """Step every job to its end, all unfinished ones in each forward; per job its
        ``Generation`` or the exception that failed it. Mutates: as ``step``."""
        results: list[Generation | Exception | None] = [None] * len(jobs)

        def collect(index: int, outcome: StepOutcome) -> bool:
            if outcome.error is not None:
                results[index] = outcome.error
            elif outcome.event.generation is not None:
                results[index] = outcome.event.generation
            return results[index] is not None

        driver: BatchDriver[DecodeJob] = BatchDriver(lambda batch: self.step(batch, step_rows))
        for index, job in enumerate(jobs):
            driver.add(job, functools.partial(collect, index))
        while driver:
            driver.turn()
        return results  # type: ignore[return-value]

    def _select_trees(self, jobs: Sequence[DecodeJob], indices: Sequence[int],
                      outcomes: list[StepOutcome | None], other_rows: int
                      ) -> dict[int, DraftTree]:
        """The trees jobs ``indices`` verify this step: each proposes, the budget chooses
        what of all of them one forward verifies, beside ``other_rows`` rows of other work.
        A job whose drafter fails is left out."""
        proposals = {i: _guarded(outcomes, i, jobs[i], jobs[i].propose) for i in indices}
        ready = [i for i in indices if outcomes[i] is None]
        return dict(zip(ready, self.budget.select_batch([proposals[i] for i in ready],
                                                        other_rows)))

    def _prompt_chunks(self, jobs: Sequence[DecodeJob], left: int | None) -> list[int | None]:
        """Per job: the prompt rows it runs this step without a tree (0: it sits the step
        out), or None when it verifies a tree — it is decoding, or the rest of its prompt fits
        in ``left`` rows (None: any), so the tree rides on the prompt's last forward."""
        chunks: list[int | None] = [None] * len(jobs)
        claimed: set[bytes] = set()  # blocks a job computes this step
        # In the order of ``jobs`` (arrival: first come, first served): shortest-first would
        # starve a long prompt for as long as shorter ones keep arriving.
        waiting = [i for i, job in enumerate(jobs) if job.prefilling]
        for i in waiting:
            job = jobs[i]
            block = self._next_block(job)
            if block is not None and block in claimed:
                chunks[i] = 0  # another job computes it now: take it from the cache next step
                continue
            rows = job.prompt_rows
            if left is not None and rows > left:
                chunks[i] = _aligned_chunk(job.prompt_position, rows, left, self.block_tokens)
                rows = chunks[i] or 0
            if block is not None and rows:
                claimed.add(block)
            if left is not None:
                left = max(0, left - rows)
        return chunks

    # ---- the prefix cache -------------------------------------------------------------------

    def _keys(self, job: DecodeJob) -> list[bytes]:
        if job.block_keys is None:
            job.block_keys = block_keys(job.tenant, job.prompt_ids, self.block_tokens)
        return job.block_keys

    def _next_block(self, job: DecodeJob) -> bytes | None:
        """The key of the prompt block ``job`` computes next, where a prefix cache could keep
        it (a full block starting on a boundary); else None."""
        if self.prefix_cache is None or job.prompt_position % self.block_tokens:
            return None
        index = job.prompt_position // self.block_tokens
        keys = self._keys(job)
        return keys[index] if index < len(keys) else None

    def _take_cached_prompts(self, jobs: Sequence[DecodeJob]) -> int:
        """Give every prefilling job the cached blocks that continue what its cache holds
        (at least its prompt's last token is left to run); returns the tokens given. Mutates:
        the jobs and their caches, the prefix cache's recency order and counters."""
        if self.prefix_cache is None:
            return 0
        given = 0
        size = self.block_tokens
        for job in jobs:
            if job.done or not job.prefilling or job.prompt_position % size:
                continue
            first = job.prompt_position // size
            keys = self._keys(job)
            count = self.prefix_cache.cached_blocks(keys, job.prompt_ids, first,
                                                    (job.prompt_tokens - 1) // size)
            if count:
                self.prefix_cache.take(job.cache, keys, job.prompt_ids, first, count)
                job.take_cached(count * size)
                job.blocks_offered = max(job.blocks_offered, first + count)
                given += count * size
        return given

    def _store_computed_prompts(self, jobs: Sequence[DecodeJob]) -> None:
        """Insert the prompt blocks each job's forward completed; a job whose prompt is now
        whole counts the blocks it could have taken but computed as missed. An insert that
        fails (a copy out of memory) is logged and those blocks go uncached: the forward
        succeeded, so the requests go on. Mutates: the prefix cache."""
        if self.prefix_cache is None:
            return
        size = self.block_tokens
        for job in jobs:
            end = job.prompt_position // size
            if end > job.blocks_offered:
                try:
                    # From the first block: one evicted since this job took it goes back too.
                    self.prefix_cache.insert(job.cache, self._keys(job), job.prompt_ids, 0,
                                             end)
                except Exception:  # noqa: BLE001 - a cache is an optimisation, not the answer
                    logger.exception("prefix cache: keeping %d prompt blocks failed; they go "
                                     "uncached", end - job.blocks_offered)
                job.blocks_offered = end
            if not job.prefilling:
                reusable = (job.prompt_tokens - 1) // size
                self.prefix_cache.count_missed(max(0, reusable - job.cached_tokens // size))


@dataclass(frozen=True)
class _StepPlan:
    """The rows of one step: per job index its tree (``trees``), per job its prompt chunk
    (``chunks``: None with a tree or nothing to run, 0 when it sits the step out), the jobs
    in the forward in order (``running``), and how many sit the step out."""

    trees: dict[int, DraftTree]
    chunks: list[int | None]
    running: list[int]
    jobs_sitting_out: int


def _aligned_chunk(position: int, rows: int, allowed: int, block: int) -> int | None:
    """Prompt rows to run from ``position`` with ``allowed`` rows left this step: up to the
    last block boundary that fits (at least to the next one, so a prompt always advances);
    None when that reaches the prompt's end (the rest runs whole, with its tree); 0 when no
    rows are left."""
    if allowed <= 0:
        return 0
    end = (position + allowed) // block * block
    if end <= position:
        end = (position // block + 1) * block
    return None if end >= position + rows else end - position


def _tell_observers(job: DecodeJob, logits: torch.Tensor) -> None:
    """Hand ``job``'s latest walk and its logits to the observers watching it."""
    for observer in job.observers:
        observer.verified(job.verification, logits)


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


def default_stop_token_ids(model: TargetForward, tokenizer: PreTrainedTokenizerBase) -> set[int]:
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
