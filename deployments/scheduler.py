"""Interleaving the requests of one replica, one decoding step at a time.

Each request is a synchronous iterator of steps (``Engine.stream``). The ``StepScheduler`` runs
one step of one request at a time on a single worker thread (the model is not thread-safe, and
the event loop must stay free for HTTP and Ray traffic), taking the requests in turn: a long
request slows a short one by one step per turn, never by its whole length.

A batched scheduler (one forward over the draft trees of every ready request) or a tensor-
parallel worker group replaces this class behind the same ``run`` method; the replica, ingress
and router do not change.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()  # the iterator is exhausted


@dataclass(eq=False)
class _Entry(Generic[T]):
    steps: Iterator[T]
    results: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False


class StepScheduler:
    """Round-robin over the active step iterators; one step at a time on one thread.

    Mutates: its queue of active requests; each iterator is advanced (and closed, when its
    consumer leaves early) only on the worker thread.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="toolspec-steps")
        self._ready: deque[_Entry] = deque()
        self._loop_task: asyncio.Task | None = None

    @property
    def active(self) -> int:
        return len(self._ready)

    async def run(self, steps: Iterator[T]) -> AsyncIterator[T]:
        """The items of ``steps`` as the scheduler produces them; exceptions pass through.
        Leaving early (e.g. a client disconnect) closes ``steps`` on the worker thread."""
        entry: _Entry[T] = _Entry(steps)
        self._ready.append(entry)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._serve())
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

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while self._ready:
            entry = self._ready.popleft()
            if entry.cancelled:
                await loop.run_in_executor(self._executor, _close, entry.steps)
                continue
            try:
                item = await loop.run_in_executor(self._executor, next, entry.steps, _END)
            except Exception as error:  # the request's own failure, handed to its consumer
                item = error
            entry.results.put_nowait(item)
            if item is not _END and not isinstance(item, BaseException):
                self._ready.append(entry)

    def shutdown(self) -> None:
        """Stop the worker thread (pending steps finish first)."""
        self._executor.shutdown(wait=True)


def _close(steps: Iterator[object]) -> None:
    close = getattr(steps, "close", None)
    if close is not None:
        close()
