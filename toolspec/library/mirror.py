"""A process's private copy of part of a shared call library, filled as calls arrive.

Where drafting must never wait on another process — a replica's decode loop, the ToolSpec
proposer inside vLLM's worker — drafters read a local ``CallLibrary`` (an LMDB directory private
to the process, removed on ``close``). Calls are copied in from elsewhere: a replica's
prefetches from the retrieval actor, the past calls a request carries to vLLM's worker. Each
distinct call is copied once, with the hits and times it had where it came from (copying it
again would count its uses twice).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable
from typing import Any

from toolspec.calls.formats import ToolCall
from toolspec.library.errors import InvalidCallError
from toolspec.library.records import CallRecord, Usage, canonical_arguments, record_id
from toolspec.library.store import CallLibrary
from toolspec.library.transfer import ImportedCall, import_record


class LibraryMirror:
    """A private ``CallLibrary`` (``local``) and the ids of the calls copied into it.

    Mutates: the local library and the set of known calls (``keep``, ``keep_exported``,
    ``remember``). Not thread-safe: one process, one thread writes it.
    """

    def __init__(self, max_calls: int = 20_000, prefix: str = "toolspec-library-") -> None:
        self._directory = tempfile.mkdtemp(prefix=prefix)
        self.local = CallLibrary(self._directory, max_calls=max_calls, sync=False)
        self._known: set[bytes] = set()

    def keep(self, records: Iterable[CallRecord]) -> int:
        """Copy the records not copied before, with their usage; returns how many were new.
        Raises ``LibraryError`` when the local library refuses them."""
        return self._add([(record.record_id, (record.call, record.tenant, Usage(
            record.hits, record.first_seen or None, record.last_used or None)))
            for record in records])

    def keep_exported(self, exported: Iterable[Any], where: str = "past call") -> int:
        """Copy calls given as ``transfer.export_record`` dicts (what a request carries);
        raises ``LibraryImportError`` naming the malformed one."""
        imported = [import_record(obj, f"{where} {index}") for index, obj in enumerate(exported)]
        return self._add([(_imported_id(item), item) for item in imported])

    def remember(self, calls: Iterable[ToolCall], offered: Collection[str], tenant: str,
                 on_invalid: Callable[[ToolCall, InvalidCallError], None] | None = None
                 ) -> list[CallRecord]:
        """A finished request's calls, stored locally (``CallLibrary.remember``) and known from
        now on, so the same call coming back from the shared library is not counted again."""
        stored = self.local.remember(calls, offered, tenant, on_invalid=on_invalid)
        self._known.update(record.record_id for record in stored)
        return stored

    def _add(self, items: list[tuple[bytes, ImportedCall]]) -> int:
        fresh: dict[bytes, ImportedCall] = {}
        for key, item in items:
            if key not in self._known:
                fresh.setdefault(key, item)
        if fresh:
            self.local.add_many(fresh.values())
            self._known.update(fresh)
        return len(fresh)

    def close(self) -> None:
        """Close the local library and delete its directory. Idempotent."""
        self.local.close()
        shutil.rmtree(self._directory, ignore_errors=True)


def _imported_id(item: ImportedCall) -> bytes:
    call, tenant, _ = item
    return record_id(tenant, call.name, canonical_arguments(call.arguments))
