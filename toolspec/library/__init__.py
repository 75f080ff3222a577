"""The call library: a sharded LMDB store of past tool calls, queried for whole-call drafts.

Example::

    with CallLibrary(toolspec_home() / "library") as library:
        library.add(ToolCall("get_weather", {"city": "Paris"}), tenant="acme")
        matches = library.lookup_text("acme", '{"name": "get_weather", "arguments": {"ci')
        # matches[0].continuation == 'ty": "Paris"}}'

Modules: ``records`` (what is stored), ``keys`` (index layouts), ``shards`` (LMDB environments
per process), ``index`` (writes), ``query`` (reads), ``metadata``, ``transfer`` (import/export),
``store`` (``CallLibrary``), ``cli``, ``bench``.
"""

from __future__ import annotations

from toolspec.library.errors import (
                                     InvalidCallError,
                                     InvalidTenantError,
                                     LibraryClosedError,
                                     LibraryError,
                                     LibraryFullError,
                                     LibraryImportError,
                                     NotALibraryError,
                                     SettingMismatchError,
                                     ShardCountMismatchError,
                                     ShardNotOwnedError,
                                     UnsupportedStyleError,
)
from toolspec.library.metadata import DEFAULT_SHARDS
from toolspec.library.records import CallRecord, LibraryMatch, LibraryStats
from toolspec.library.store import CallLibrary

__all__ = [
    "DEFAULT_SHARDS", "CallLibrary", "CallRecord", "InvalidCallError", "InvalidTenantError",
    "LibraryClosedError", "LibraryError", "LibraryFullError", "LibraryImportError",
    "LibraryMatch", "LibraryStats", "NotALibraryError", "SettingMismatchError",
    "ShardCountMismatchError", "ShardNotOwnedError", "UnsupportedStyleError",
]
