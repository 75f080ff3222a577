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

    Jobs run in the order they were added; when more are active than a turn takes, the jobs a
    turn served go to the back, so every job is served in turn. Mutates: its active jobs.
    """

    def __init__(self, step: StepFunction, max_batch: int = 0) -> None:
        if max_batch < 0:
            raise ValueError(f"max_batch must be >= 0 (0: no limit), got {max_batch}")
        self._step = step
        self.max_batch = max_batch
        self._deliver: dict[J, Deliver] = {}  # insertion order is the turn order

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

    def drop(self, job: J) -> None:
        """Take ``job`` out without another turn (closing it is the caller's)."""
        self._deliver.pop(job, None)

    def turn(self) -> StepResult:
        """One step of the first ``max_batch`` active jobs, each outcome delivered to its job.

        A step that raises (not a job's failure, which the step reports in its outcome, but
        the step itself) fails every job in it. Returns the step's result (outcomes in the
        order of the jobs it ran: ``jobs`` before the turn, cut to ``max_batch``)."""
        batch = self.jobs[: self.max_batch or None]
        if not batch:
            return StepResult([])
        try:
            result = self._step(batch)
        except Exception as error:  # noqa: BLE001 - the step itself broke: fail its jobs
            logger.exception("a batched step failed")
            result = StepResult([StepOutcome(error=error) for _ in batch])
        over = [job for job, outcome in zip(batch, result.outcomes, strict=True)
                if outcome is not None and self._deliver[job](outcome)]
        for job in over:
            del self._deliver[job]
        if self.max_batch and len(self._deliver) > self.max_batch:
            for job in batch:  # a full batch rotates: the jobs past it go first next turn
                if job in self._deliver:
                    self._deliver[job] = self._deliver.pop(job)
        return result
