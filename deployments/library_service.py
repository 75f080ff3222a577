"""The retrieval actor: the one process that owns the shared call library (sharded LMDB).

Replicas ask it for the calls a request's tools are likely to need and send it every finished
call; they never open the shared library themselves (LMDB environments must be opened in the
process that uses them, and one owner keeps writers serialised).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolspec.formats import ToolCall
from toolspec.library import CallLibrary, CallRecord, LibraryError
from toolspec.library.records import STYLES
from toolspec.models import toolspec_home


def default_library_path() -> str:
    return str(toolspec_home() / "serve-library")


class LibraryService:
    """Serves ``top_calls`` and takes ``add_calls``. Mutates: the library on disk."""

    def __init__(self, path: str | None = None, shards: int | None = None,
                 max_calls: int | None = 100_000, seed_file: str | None = None) -> None:
        self.path = Path(path or default_library_path())
        self.library = CallLibrary(self.path, shards=shards, max_calls=max_calls)
        if seed_file and self.library.stats().calls == 0:
            self.library.import_file(seed_file)

    def top_calls(self, tenant: str, tools: Sequence[str], per_tool: int) -> list[CallRecord]:
        """The ``per_tool`` most used calls of each of ``tools`` for ``tenant``."""
        records: list[CallRecord] = []
        for tool in tools:
            try:
                records.extend(self.library.top_calls(tenant, per_tool, tool))
            except LibraryError:
                continue  # e.g. a tool name the library cannot store: nothing to offer
        return records

    def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str, k: int
                       ) -> tuple[list[CallRecord], bool]:
        """Up to ``k`` of ``tenant``'s calls of ``tool`` whose call-object text extends
        ``typed`` (the call written so far, from its ``{``), in whichever JSON spacing
        ``typed`` is written. Also whether that is all of them (fewer than ``k`` matched in
        every spacing): then no longer ``typed`` can match a call not returned."""
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

    def add_calls(self, tenant: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> int:
        """Store finished calls (name, arguments); returns how many were stored."""
        return self.library.add_many((ToolCall(name, arguments), tenant)
                                     for name, arguments in calls)

    def stats(self) -> dict[str, Any]:
        stats = self.library.stats()
        return {"calls": stats.calls, "tenants": stats.tenants, "tools": stats.tools,
                "path": str(self.path)}

    def check_health(self) -> None:
        self.library.stats()  # raises if the environments cannot be read

    def __del__(self) -> None:
        library = getattr(self, "library", None)
        if library is not None:
            library.close()
