"""A replica's local view of the shared call library, filled ahead of use.

The drafter's ``propose`` runs inside the decode loop and must not wait on the network, so it
reads a local ``CallLibrary`` (an LMDB directory private to this replica, opened in this
process). When a request starts, the calls its tools are likely to need are fetched from the
retrieval actor in the background and added to the local view; a draft made before they
arrive just does not use them, one made after does. Finished calls go into the local view at
once and to the actor in the background. While a request decodes, ``lookup`` asks the actor
for the calls that extend what the output has typed so far (``decode_lookups``); they arrive in
the local view the same way.

If the actor is down or slow, lookups fail fast (a timeout), the replica waits
``retry_after_s`` before asking again, and decoding goes on with what the local view holds.

``ShardedLibraryRemote`` is how a replica reaches the retrieval actors under Serve: each
question goes to the actor owning its shard. It keeps only the library's shard count, asked
once; the cache mutates its local view and counters (``LibraryCache``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from deployments.messages import ChatRequest
from deployments.ops import metrics
from deployments.ops.tracing import tracer
from toolspec.calls.formats import ToolCall
from toolspec.library import CallRecord, LibraryError
from toolspec.library.keys import shard_of
from toolspec.library.mirror import LibraryMirror

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class LibraryRemote(Protocol):
    """The retrieval actor as a replica reaches it (a Serve handle in production)."""

    async def top_calls(self, tenant: str, tools: Sequence[str], per_tool: int
                        ) -> list[CallRecord]: ...

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[CallRecord], bool]: ...

    async def add_calls(self, tenant: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> int: ...

    async def stats(self) -> dict[str, Any]: ...


class ShardedLibraryRemote:
    """The retrieval actors through their Serve deployment handles: each question goes to the
    actor owning the shard of its (tenant, tool) — shard ``s`` belongs to actor ``s % N`` —
    and one spanning several tools asks their owners at once. The library's shard count is
    asked of the first actor once."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)
        self._shards: int | None = None

    async def _owner(self, tenant: str, tool: str) -> int:
        """The index of the actor owning (``tenant``, ``tool``)'s shard."""
        if len(self.handles) == 1:
            return 0
        if self._shards is None:
            self._shards = (await self.handles[0].stats.remote())["shards"]
        return shard_of(tenant, tool, self._shards) % len(self.handles)

    async def _by_owner(self, tenant: str, tools: Sequence[str]) -> dict[int, list[str]]:
        """``tools`` grouped by the index of the actor that owns each."""
        grouped: dict[int, list[str]] = {}
        for tool in tools:
            grouped.setdefault(await self._owner(tenant, tool), []).append(tool)
        return grouped

    async def top_calls(self, tenant: str, tools: list[str], per_tool: int) -> list[Any]:
        grouped = await self._by_owner(tenant, tools)
        answers = await asyncio.gather(*(self.handles[owner].top_calls.remote(
            tenant, owned, per_tool) for owner, owned in grouped.items()))
        return [record for answer in answers for record in answer]

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[Any], bool]:
        owner = self.handles[await self._owner(tenant, tool)]
        return await owner.matching_calls.remote(tenant, tool, typed, arguments_key, k)

    async def add_calls(self, tenant: str, calls: list[tuple[str, dict[str, Any]]]) -> int:
        grouped = await self._by_owner(tenant, sorted({name for name, _ in calls}))
        stored = await asyncio.gather(*(self.handles[owner].add_calls.remote(
            tenant, [call for call in calls if call[0] in owned])
            for owner, owned in grouped.items()))
        return sum(stored)

    async def stats(self) -> dict[str, Any]:
        """The parts' stats summed (calls), and how many actors answered."""
        parts = await asyncio.gather(*(handle.stats.remote() for handle in self.handles))
        return {"calls": sum(part["calls"] for part in parts), "actors": len(parts),
                "shards": parts[0]["shards"]}


class LibraryCache:
    """Local library view plus background prefetch and write-back.

    Mutates: the local library (prefetched, looked-up and finished calls); ``fetched``,
    ``lookups``, ``sent`` and ``failures`` counters.
    """

    def __init__(self, remote: LibraryRemote | None, per_tool: int = 16,
                 timeout_s: float = 2.0, retry_after_s: float = 5.0,
                 max_calls: int = 20_000, per_lookup: int = 16) -> None:
        self.remote = remote
        self.per_tool = per_tool
        self.per_lookup = per_lookup
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.mirror = LibraryMirror(max_calls, prefix="toolspec-replica-library-")
        self.local = self.mirror.local
        self._down_until = 0.0
        self._tasks: set[asyncio.Task] = set()
        self.fetched = 0
        self.lookups = 0
        self.sent = 0
        self.failures = 0

    def prefetch(self, request: ChatRequest) -> asyncio.Task | None:
        """Start fetching the stored calls of ``request``'s tools; returns at once, with the
        task (done once they are in the local view) or None when nothing was started."""
        if request.tools is not None and self._remote_up():
            return self._spawn(self._fetch(request.tenant, request.tools.names))
        return None

    def lookup(self, tenant: str, tool: str, typed: str, arguments_key: str
               ) -> asyncio.Task | None:
        """Start fetching ``tenant``'s calls of ``tool`` that extend ``typed`` (the call object
        written so far); returns at once. The task's result: whether those were all such calls
        (None if the actor failed). None, and nothing started, while the actor is down."""
        if not self._remote_up():
            return None
        self.lookups += 1
        return self._spawn(self._fetch_matching(tenant, tool, typed, arguments_key))

    def remember(self, request: ChatRequest, calls: Sequence[ToolCall]) -> None:
        """Record a finished request's calls (those to tools it offered: ``CallLibrary.remember``,
        the one path) locally now, and in the shared library in the background. A call the
        library refuses is logged and left out. Mutates: the local library."""
        offered = request.tools.names if request.tools is not None else ()
        refused: list[ToolCall] = []

        def refuse(call: ToolCall, error: LibraryError) -> None:
            logger.warning("call not kept in the local library: %s", error)
            refused.append(call)

        if not any(call.name in offered for call in calls):
            return
        with tracer.start_as_current_span("toolspec.library.add") as span:
            try:
                stored = self.mirror.remember(calls, offered, request.tenant, on_invalid=refuse)
            except LibraryError as error:  # the local library is closed or broken
                logger.warning("calls not kept in the local library: %s", error)
                stored = []
            span.set_attribute("toolspec.calls", len(stored))
        sent = [call for call in calls if call.name in offered and call not in refused]
        if sent and self._remote_up():
            self._spawn(self._send(request.tenant, [(c.name, dict(c.arguments)) for c in sent]))

    async def ping(self) -> bool:
        """Whether the retrieval actor answers now (within the timeout; a failure starts the
        usual back-off)."""
        if self.remote is None:
            return False
        return await self._call(self.remote.stats()) is not None

    async def drain(self) -> None:
        """Wait for the background fetches and sends started so far: the point a test waits
        for. A replica shutting down does not wait (Serve's replica destructor is sync here):
        calls still being sent are lost with it — the library is a cache of past calls, and
        the calls themselves reached their client."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        self.mirror.close()

    # ---- background work ------------------------------------------------------------------

    def _remote_up(self) -> bool:
        return self.remote is not None and time.monotonic() >= self._down_until

    def _spawn(self, work: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _fetch(self, tenant: str, tools: Sequence[str]) -> None:
        began = time.perf_counter()
        records = await self._call(self.remote.top_calls(tenant, list(tools), self.per_tool))
        _record_lookup("prefetch", records, began)
        if records:
            self._keep(records)

    async def _fetch_matching(self, tenant: str, tool: str, typed: str, arguments_key: str
                              ) -> bool | None:
        began = time.perf_counter()
        answer = await self._call(self.remote.matching_calls(tenant, tool, typed, arguments_key,
                                                             self.per_lookup))
        _record_lookup("decode", None if answer is None else answer[0], began)
        if answer is None:
            return None
        records, complete = answer
        self._keep(records)
        return complete

    def _keep(self, records: Sequence[CallRecord]) -> None:
        """Copy the records not yet in the local view into it."""
        try:
            self.fetched += self.mirror.keep(records)
        except LibraryError as error:
            logger.warning("prefetched calls not kept in the local library: %s", error)

    async def _send(self, tenant: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        stored = await self._call(self.remote.add_calls(tenant, calls)) is not None
        metrics.record_library_add("stored" if stored else "failure", len(calls))
        if stored:
            self.sent += len(calls)

    async def _call(self, awaitable: Any) -> Any:
        """``awaitable``'s result, or None when the actor fails or is slow (then back off)."""
        try:
            return await asyncio.wait_for(awaitable, self.timeout_s)
        except Exception as error:  # Ray raises many kinds (actor died, unavailable, timeout)
            self.failures += 1
            self._down_until = time.monotonic() + self.retry_after_s
            logger.warning("retrieval actor unavailable (%s); decoding without it for %.0f s",
                           type(error).__name__, self.retry_after_s)
            return None


def _record_lookup(kind: str, records: Sequence[CallRecord] | None, began: float) -> None:
    """A call to the retrieval actor: it failed (None), brought calls (hit) or none (miss)."""
    outcome = "failure" if records is None else "hit" if records else "miss"
    metrics.record_library_lookup(kind, outcome, time.perf_counter() - began)
