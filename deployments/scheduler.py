"""Batching the requests of one replica: every step, one forward for all of them.

A request is a job (``toolspec.job.DecodeJob``, or a test's scripted one); the
``BatchScheduler`` runs a loop on one worker thread (the model is not thread-safe, and the event
loop must stay free for HTTP and Ray traffic): each turn it hands every active job to the
engine's ``step`` — one ragged forward over all their rows: draft trees, decoding steps, and
chunks of new prompts (whole blocks filling the step's row budget, first come first served) —
and delivers each job's event to its consumer. A request that arrives joins the next step; one
that ends leaves; one that fails (its drafter or grammar raised) fails alone; one whose
consumer left (a client disconnect, a deadline) is closed at the next turn, which frees its
slot within one step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments import metrics
from toolspec.engine import StepOutcome
from toolspec.generation import StepEvent

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class Job(Protocol):
    done: bool

    def close(self) -> None:
        """End the job early (idempotent)."""


StepFunction = Callable[[Sequence[Any]], "list[StepOutcome | None]"]
_END = object()  # the job finished: its last event was delivered


@dataclass(eq=False)
class _Entry:
    job: Any
    loop: asyncio.AbstractEventLoop
    results: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False


class BatchScheduler:
    """Runs ``step`` over all active jobs, one forward per turn, on one worker thread.

    ``step`` runs one step of the jobs it is given (``ChatEngine.step``: how many prompt rows
    a step takes is the engine's setting); ``max_batch``: jobs per step at most (the rest wait
    their turn, oldest first). Mutates: its set of active jobs; jobs are advanced and closed
    only on the worker thread.
    """

    def __init__(self, step: StepFunction, max_batch: int = 64) -> None:
        self._step = step
        self.max_batch = max_batch
        self._active: list[_Entry] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="toolspec-batch", daemon=True)
        self._thread.start()
        self.steps = 0  # forwards run (for diagnostics and metrics)
        self.batched = 0  # job-steps run in them

    @property
    def active(self) -> int:
        return len(self._active)

    async def run(self, job: Job) -> AsyncIterator[StepEvent]:
        """The events of ``job`` as the steps produce them; its failure is raised here.
        Leaving early (a client disconnect) closes the job on the worker thread."""
        entry = _Entry(job, asyncio.get_running_loop())
        with self._wake:
            if self._stopping:
                raise RuntimeError("the scheduler is shut down")
            self._active.append(entry)
            self._wake.notify()
        try:
            while True:
                item = await entry.results.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            entry.cancelled = True

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._active and not self._stopping:
                    self._wake.wait()
                if self._stopping and not self._active:
                    return
                self._drop_cancelled()
                batch = self._active[: self.max_batch]
            if not batch:
                continue
            try:
                outcomes = self._step([entry.job for entry in batch])
            except Exception as error:  # noqa: BLE001 - the step itself broke: fail its jobs
                logger.exception("a batched step failed")
                outcomes = [StepOutcome(error=error) for _ in batch]
            self.steps += 1
            stepped = sum(outcome is not None for outcome in outcomes)
            self.batched += stepped
            metrics.record_batch(stepped)
            finished = [entry for entry, outcome in zip(batch, outcomes)
                        if self._deliver(entry, outcome)]
            with self._wake:
                for entry in finished:
                    self._active.remove(entry)
                # Jobs past the batch go first next time (a full batch rotates).
                if len(self._active) > self.max_batch:
                    served = [e for e in batch if e in self._active]
                    self._active = [e for e in self._active if e not in served] + served
                active = len(self._active)
            metrics.record_queue(min(active, self.max_batch), max(0, active - self.max_batch))

    def _drop_cancelled(self) -> None:
        """Close the jobs whose consumer left. Called with the lock held."""
        for entry in [e for e in self._active if e.cancelled]:
            self._active.remove(entry)
            try:
                entry.job.close()
            except Exception:  # noqa: BLE001 - closing a job must not stop the loop
                logger.exception("closing an abandoned job failed")

    @staticmethod
    def _deliver(entry: _Entry, outcome: StepOutcome | None) -> bool:
        """Hand ``outcome`` to the job's consumer; True when the job is over."""
        if outcome is None:  # it sat this step out (its prompt waits for rows)
            return False
        if outcome.error is not None:
            entry.job.close()  # idempotent: a job the engine failed is closed already
        items: list[Any] = [outcome.error] if outcome.error is not None else [outcome.event]
        over = outcome.error is not None or outcome.event.generation is not None or entry.job.done
        if over and outcome.error is None:
            items.append(_END)
        try:
            for item in items:
                entry.loop.call_soon_threadsafe(entry.results.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening
            entry.job.close()
            return True
        return over

    def shutdown(self) -> None:
        """Stop the worker thread once the active jobs are done (or cancelled)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=60)
