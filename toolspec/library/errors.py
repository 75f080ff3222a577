"""The exceptions of the call library; each message says what was wrong and what to do."""

from __future__ import annotations


class LibraryError(Exception):
    """Base of every error the call library raises on purpose."""


class InvalidTenantError(LibraryError, ValueError):
    """A tenant name the index keys cannot hold (empty, too long, or containing a NUL byte)."""


class InvalidCallError(LibraryError, ValueError):
    """A tool call, token list or timestamp that cannot be stored."""


class UnsupportedStyleError(LibraryError, ValueError):
    """A JSON style or arguments key the library keeps no rendering for."""


class SettingMismatchError(LibraryError):
    """A library reopened with a setting other than the one it was created with."""


class ShardCountMismatchError(SettingMismatchError):
    """A library reopened with a shard count other than the one it was created with."""


class NotALibraryError(LibraryError):
    """A directory that is neither empty nor a call library (or whose metadata is unreadable)."""


class LibraryClosedError(LibraryError):
    """A call library used after ``close()``."""


class LibraryImportError(LibraryError, ValueError):
    """A file to import that is missing or not in a format the library reads."""


class LibraryFullError(LibraryError):
    """A shard whose memory map could not grow any further (disk or address space exhausted)."""


class ShardNotOwnedError(LibraryError):
    """A call of a (tenant, tool) whose shard this library object does not serve (it owns a
    part of the shards: send the call to the part that owns it)."""
