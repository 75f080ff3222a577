"""The one batch driver: a changing set of jobs stepped together, one forward per turn.

Every place that runs many requests at once drives its jobs through a ``BatchDriver``:
``Engine.run`` (a fixed set, to their ends), the benchmark's closed loop (jobs join as others
end) and the replica's scheduler (jobs join and leave between turns, from HTTP). The driver owns
the order of the active jobs and nothing else: how a step is run (the row budget, the prefix
cache) is the step function's (``Engine.step``), and what happens to a job's outcome is its
``deliver`` callback's.

Not thread-safe: one thread adds, drops and turns (the scheduler's worker thread).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from toolspec.core.generation import StepOutcome, StepResult

logger = logging.getLogger(__name__)

J = TypeVar("J")
StepFunction = Callable[[Sequence[J]], StepResult]
# Told each outcome of its job (never None: a job that sat a step out is not told); returns
# True when the job is over, which takes it out of the driver.
Deliver = Callable[[StepOutcome], bool]


class BatchDriver(Generic[J]):
    """Steps its active jobs with ``step``, at most ``max_batch`` a turn (0: all of them).

    Oldest first: a step gets its jobs in the order they were added (the step gives prompt
    rows first come, first served). When more jobs are active than a turn takes, the turn
    takes the first ``max_batch`` in turn order, in which a job that is still waiting for
    its first token — outside the batch, sitting a step out, or its prompt computed chunk by
    chunk — keeps its place, and a job the step gave tokens goes to the back: later arrivals
    never pass an older waiting prompt, and every decoding job is served in turn. (While
    ``max_batch`` prompts wait, they take the whole batch: no job decodes until the oldest
    has its first token, which a step without decoding computes whole.)
    Mutates: its active jobs.
    """

    def __init__(self, step: StepFunction, max_batch: int = 0) -> None:
        if max_batch < 0:
            raise ValueError(f"max_batch must be >= 0 (0: no limit), got {max_batch}")
        self._step = step
        self.max_batch = max_batch
        self._deliver: dict[J, Deliver] = {}  # insertion order is the turn order
        self._arrival: dict[J, int] = {}  # the order jobs were added in: a step's order
        self._added = itertools.count()

    def __len__(self) -> int:
        return len(self._deliver)

    @property
    def jobs(self) -> list[J]:
        """The active jobs, in turn order."""
        return list(self._deliver)

    def add(self, job: J, deliver: Deliver) -> None:
        """Make ``job`` active from the next turn on; ``deliver`` gets its outcomes."""
        if job in self._deliver:
            raise ValueError("the job is active already")
        self._deliver[job] = deliver
        self._arrival[job] = next(self._added)

    def drop(self, job: J) -> None:
        """Take ``job`` out without another turn (closing it is the caller's)."""
        self._deliver.pop(job, None)
        self._arrival.pop(job, None)

    def turn(self) -> StepResult:
        """One step of the first ``max_batch`` active jobs in turn order, given to the step
        oldest first; each outcome delivered to its job.

        A step that raises (not a job's failure, which the step reports in its outcome, but
        the step itself) fails every job in it. Returns the step's result (outcomes in the
        order of the jobs it ran: ``jobs`` before the turn, cut to ``max_batch``, oldest
        first)."""
        batch = sorted(self.jobs[: self.max_batch or None], key=self._arrival.__getitem__)
        if not batch:
            return StepResult([])
        try:
            result = self._step(batch)
        except Exception as error:  # noqa: BLE001 - the step itself broke: fail its jobs
            logger.exception("a batched step failed")
            result = StepResult([StepOutcome(error=error) for _ in batch])
        advanced = []  # jobs the step gave tokens, still active
        for job, outcome in zip(batch, result.outcomes, strict=True):
            if outcome is None:
                continue  # it sat the step out: not told, and it keeps its place
            if self._deliver[job](outcome):
                self.drop(job)
            elif outcome.event is not None and outcome.event.tokens:
                advanced.append(job)
        if self.max_batch and len(self._deliver) > self.max_batch:
            # A full batch rotates: the jobs it gave tokens go to the back. The others keep
            # their place ahead of them and of later arrivals: the jobs past the batch, and
            # prompts still waiting for their first token (they took a chunk or sat out).
            for job in advanced:
                self._deliver[job] = self._deliver.pop(job)
        return result
