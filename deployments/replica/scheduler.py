"""Batching the requests of one replica: every step, one forward for all of them.

A request is a job (``toolspec.core.job.DecodeJob``, or a test's scripted one); the
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
import functools
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.ops import metrics
from toolspec.core.batch import BatchDriver, StepFunction
from toolspec.core.generation import StepEvent, StepOutcome

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class Job(Protocol):
    done: bool

    def close(self) -> None:
        """End the job early (idempotent)."""


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
    their turn, oldest first). The turns are ``toolspec.core.batch.BatchDriver``'s, the one
    batch driver the benchmark runs too; this class adds the thread, arrivals from the event
    loop, and delivery to each request's consumer. Mutates: its set of active jobs; jobs are
    advanced and closed only on the worker thread.
    """

    def __init__(self, step: StepFunction, max_batch: int = 64) -> None:
        self._driver: BatchDriver[Any] = BatchDriver(step, max_batch)
        self._entries: dict[int, _Entry] = {}  # id(job) -> its entry, for the worker thread
        self._arrivals: list[_Entry] = []  # guarded by ``_wake``; the worker takes them in
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="toolspec-batch", daemon=True)
        self._thread.start()

    @property
    def max_batch(self) -> int:
        return self._driver.max_batch

    @property
    def active(self) -> int:
        return len(self._driver) + len(self._arrivals)

    async def run(self, job: Job) -> AsyncIterator[StepEvent]:
        """The events of ``job`` as the steps produce them; its failure is raised here.
        Leaving early (a client disconnect) closes the job on the worker thread."""
        entry = _Entry(job, asyncio.get_running_loop())
        with self._wake:
            if self._stopping:
                raise RuntimeError("the scheduler is shut down")
            self._arrivals.append(entry)
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
                while not self._arrivals and not self._driver and not self._stopping:
                    self._wake.wait()
                if self._stopping and not self._arrivals and not self._driver:
                    return
                arrivals, self._arrivals = self._arrivals, []
            for entry in arrivals:
                self._entries[id(entry.job)] = entry
                self._driver.add(entry.job, functools.partial(self._deliver, entry))
            self._drop_cancelled()
            if not self._driver:
                continue
            result = self._driver.turn()
            metrics.record_batch(sum(outcome is not None for outcome in result.outcomes))
            active = len(self._driver)
            metrics.record_queue(min(active, self.max_batch), max(0, active - self.max_batch))

    def _drop_cancelled(self) -> None:
        """Close the jobs whose consumer left."""
        for job in self._driver.jobs:
            entry = self._entries[id(job)]
            if not entry.cancelled:
                continue
            self._driver.drop(job)
            del self._entries[id(job)]
            try:
                job.close()
            except Exception:  # noqa: BLE001 - closing a job must not stop the loop
                logger.exception("closing an abandoned job failed")

    def _deliver(self, entry: _Entry, outcome: StepOutcome) -> bool:
        """Hand ``outcome`` to the job's consumer; True when the job is over."""
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
            over = True
        if over:
            del self._entries[id(entry.job)]
        return over

    def shutdown(self) -> None:
        """Stop the worker thread once the active jobs are done (or cancelled)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=60)
