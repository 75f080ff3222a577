"""The retrieval actors: the processes that own the shared call library (sharded LMDB).

Replicas ask them for the calls a request's tools are likely to need and send them every
finished call; they never open the shared library themselves (LMDB environments must be opened
in the process that uses them, and one owner per shard keeps its writers serialised). With
``library.actors: N`` each of N actors owns the shards ``s % N == i`` of one library directory
— every call of one tool of one tenant lives in one shard, so in one actor — and a replica's
``ShardedLibraryRemote`` sends each question to the actor that owns it, asking several at once
where a question spans tools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolspec import toolspec_home
from toolspec.calls.formats import ToolCall
from toolspec.library import CallLibrary, CallRecord, LibraryError
from toolspec.library.records import STYLES
from toolspec.library.transfer import read_calls

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the actor's Serve log


def default_library_path() -> str:
    return str(toolspec_home() / "serve-library")


class LibraryService:
    """Serves ``top_calls`` and ``matching_calls`` and takes ``add_calls``, concurrently: the
    LMDB work runs on worker threads (readers do not wait for each other; LMDB serialises the
    writers of each shard). The calls a decode-time lookup served are marked used (their LRU
    place moves up), in a batch every ``touch_every_s``. Mutates: the library on disk."""

    def __init__(self, path: str | None = None, shards: int | None = None,
                 max_calls: int | None = 100_000, seed_file: str | None = None,
                 touch_every_s: float = 2.0, part: tuple[int, int] = (0, 1)) -> None:
        self.path = Path(path or default_library_path())
        count = part[1]
        self.library = CallLibrary(self.path, shards=shards, part=part,
                                   max_calls=None if max_calls is None
                                   else -(-max_calls // count))  # this part's share of the cap
        if seed_file and self.library.stats().calls == 0:
            self.library.add_many(entry for entry in read_calls(seed_file, "default")
                                  if self.library.owns(entry[1], entry[0].name))
        self.touch_every_s = touch_every_s
        self._used: dict[bytes, CallRecord] = {}  # served by lookups since the last flush
        self._flusher: asyncio.Task | None = None

    async def top_calls(self, tenant: str, tools: Sequence[str], per_tool: int
                        ) -> list[CallRecord]:
        """The ``per_tool`` most used calls of each of ``tools`` for ``tenant``."""
        return await asyncio.to_thread(self._top_calls, tenant, tools, per_tool)

    def _top_calls(self, tenant: str, tools: Sequence[str], per_tool: int) -> list[CallRecord]:
        records: list[CallRecord] = []
        for tool in tools:
            try:
                records.extend(self.library.top_calls(tenant, per_tool, tool))
            except LibraryError:
                continue  # e.g. a tool name the library cannot store: nothing to offer
        return records

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[CallRecord], bool]:
        """Up to ``k`` of ``tenant``'s calls of ``tool`` whose call-object text extends
        ``typed`` (the call written so far, from its ``{``), in whichever JSON spacing
        ``typed`` is written. Also whether that is all of them (fewer than ``k`` matched in
        every spacing): then no longer ``typed`` can match a call not returned."""
        records, complete = await asyncio.to_thread(self._matching_calls, tenant, tool, typed,
                                                    arguments_key, k)
        self._note_used(records)
        return records, complete

    def _matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str, k: int
                        ) -> tuple[list[CallRecord], bool]:
        found: dict[bytes, CallRecord] = {}
        complete = True
        for style in STYLES.values():
            try:
                matches = self.library.lookup_text(tenant, typed, arguments_key, style, tool, k)
            except LibraryError:
                continue  # a tool name or arguments key the library cannot store
            complete = complete and len(matches) < k
            for match in matches:
                found.setdefault(match.record.record_id, match.record)
        return list(found.values()), complete

    def _note_used(self, records: Sequence[CallRecord]) -> None:
        for record in records:
            self._used[record.record_id] = record
        if self._used and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.touch_every_s)
        used, self._used = list(self._used.values()), {}
        try:
            await asyncio.to_thread(self.library.touch, used)
        except LibraryError as error:  # the LRU order is a hint: never fail a lookup for it
            logger.warning("lookups' calls not marked used: %s", error)

    async def add_calls(self, tenant: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> int:
        """Store finished calls (name, arguments); returns how many were stored (committed,
        fsynced, before this returns)."""
        return await asyncio.to_thread(self.library.add_many,
                                       [(ToolCall(name, arguments), tenant)
                                        for name, arguments in calls])

    async def stats(self) -> dict[str, Any]:
        stats = await asyncio.to_thread(self.library.stats)
        return {"calls": stats.calls, "tenants": stats.tenants, "tools": stats.tools,
                "path": str(self.path), "shards": self.library.shards,
                "part": list(self.library.part)}

    def check_health(self) -> None:
        self.library.stats()  # raises if the environments cannot be read

    def __del__(self) -> None:
        library = getattr(self, "library", None)
        if library is not None:
            library.close()
