"""``library.json``: the settings fixed when a library is created (shard count, ranking half-life).

Both are baked into the stored data: the shard of a call is its hash modulo the shard count, and
index values hold scores computed with the half-life. So they are written once, atomically, and
a reopen asking for other values is refused.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from toolspec.library.errors import NotALibraryError, SettingMismatchError, ShardCountMismatchError

META_FILE = "library.json"
META_FORMAT = "toolspec-call-library"
DEFAULT_SHARDS = 8
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class LibraryMetadata:
    shards: int
    half_life_s: float
    format: str = META_FORMAT
    version: int = 1


def _create(path: Path, settings: LibraryMetadata) -> None:
    """Writes ``library.json`` into a new or empty ``path`` (a concurrent creator's file wins)."""
    if path.exists() and any(not p.name.startswith(f".{META_FILE}") for p in path.iterdir()):
        raise NotALibraryError(f"{path} is not empty and has no {META_FILE}: give the path of an "
                               f"existing call library or of a new/empty directory")
    path.mkdir(parents=True, exist_ok=True)
    partial = path / f".{META_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(asdict(settings)))
    try:
        os.link(partial, path / META_FILE)  # atomic, and never replaces an existing file
    except FileExistsError:
        pass
    finally:
        partial.unlink()


def _read(meta: Path) -> LibraryMetadata:
    try:
        document = json.loads(meta.read_text())
        settings = LibraryMetadata(shards=document["shards"],
                                   half_life_s=float(document["half_life_s"]),
                                   format=document["format"], version=document["version"])
        assert settings.format == META_FORMAT and isinstance(settings.shards, int)
        assert settings.shards >= 1 and settings.half_life_s > 0
        return settings
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise NotALibraryError(f"{meta} is not call-library metadata; restore it or use "
                               f"another directory") from None


def open_metadata(path: Path, shards: int | None, half_life_s: float | None) -> LibraryMetadata:
    """The settings of the library at ``path``, creating them (None → the defaults) for a new
    library; raises ShardCountMismatchError / SettingMismatchError when they differ."""
    meta = path / META_FILE
    if not meta.exists():
        count = DEFAULT_SHARDS if shards is None else shards
        if not isinstance(count, int) or not 1 <= count <= 256:
            raise ValueError(f"shards must be an int in 1..256, got {count!r}")
        half_life = DEFAULT_HALF_LIFE_S if half_life_s is None else float(half_life_s)
        if not half_life > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        _create(path, LibraryMetadata(count, half_life))
    settings = _read(meta)
    if shards is not None and shards != settings.shards:
        raise ShardCountMismatchError(
            f"{path} was created with {settings.shards} shards, not {shards}; open it with "
            f"shards={settings.shards} (or None), or export it and import into a new library")
    if half_life_s is not None and float(half_life_s) != settings.half_life_s:
        raise SettingMismatchError(
            f"{path} ranks with half_life_s={settings.half_life_s}, not {half_life_s}; stored "
            f"scores depend on it: pass None, or export and import into a new library")
    return settings
