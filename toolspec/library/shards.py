"""One LMDB environment per shard, opened lazily in the process that uses it.

LMDB forbids opening an environment twice in one process (py-lmdb refuses with ``lmdb.Error``), and
an environment must not be used across ``fork``. So every shard directory maps to one process-wide
``ShardEnv`` shared by all ``CallLibrary`` objects on it (reference-counted), which opens its
environment on first use and remembers the pid. Used from a forked child it closes the inherited
handle (py-lmdb will not open a second one) and reopens. Closing there releases the parent's
reader-table slots, so fork while no other thread of the parent is inside a lookup.

Writes go through ``ShardEnv.write``: when LMDB reports the map full the transaction is aborted,
the map doubled with ``set_mapsize`` and the whole transaction run again. When another process has
grown the map (``MapResizedError``) the new size is adopted and the transaction retried.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from toolspec.library.errors import LibraryFullError

T = TypeVar("T")
DB_NAMES = ("records", "text", "tokens", "lru", "popular", "tools")
MAX_GROWTHS = 40

_registry: dict[str, ShardEnv] = {}
_registry_lock = threading.Lock()


def _reset_locks_after_fork() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for shard in _registry.values():
        shard._lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_locks_after_fork)


@dataclass(frozen=True)
class EnvOptions:
    map_size: int
    sync: bool = True
    max_readers: int = 126


class ShardEnv:
    """A shard's LMDB environment and named databases, (re)opened in whichever process uses it."""

    def __init__(self, path: Path, options: EnvOptions) -> None:
        self.path = path
        self.options = options
        self.users = 0
        self._env: lmdb.Environment | None = None
        self._dbs: dict[str, Any] = {}
        self._pid = 0
        self._lock = threading.Lock()

    @classmethod
    def acquire(cls, path: Path, options: EnvOptions) -> ShardEnv:
        """The process's ShardEnv for ``path`` (created on first use); adds one user.

        The options of the first user stand while the environment is shared."""
        key = os.path.realpath(path)
        with _registry_lock:
            shard = _registry.get(key)
            if shard is None:
                shard = _registry[key] = cls(Path(key), options)
            shard.users += 1
            return shard

    def release(self) -> None:
        """Drops one user; the last one closes the environment and forgets this shard."""
        with _registry_lock:  # held while closing, so nobody reopens the path meanwhile
            self.users -= 1
            if self.users > 0:
                return
            _registry.pop(str(self.path), None)
            with self._lock:
                if self._env is not None:
                    self._env.close()
                self._env, self._dbs = None, {}

    def _opened(self) -> tuple[lmdb.Environment, dict[str, Any]]:
        env, pid = self._env, os.getpid()
        if env is not None and self._pid == pid:
            return env, self._dbs
        with self._lock:
            if self._env is not None and self._pid != pid:
                self._env.close()  # inherited across fork: py-lmdb will not open a second one
                self._env = None
            if self._env is None:
                self._open(pid)
            assert self._env is not None
            return self._env, self._dbs

    def _open(self, pid: int) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = self.path / "data.mdb"
        env = lmdb.open(str(self.path), map_size=max(self.options.map_size,
                                                     data.stat().st_size if data.exists() else 0),
                        max_dbs=len(DB_NAMES) + 2, subdir=True, sync=self.options.sync,
                        max_readers=self.options.max_readers,
                        max_spare_txns=0)  # a cached reader slot can be taken over after fork
        env.reader_check()  # clear slots left by killed processes
        dbs = self._retry(env, lambda txn: {name: env.open_db(name.encode(), txn=txn)
                                            for name in DB_NAMES})
        self._env, self._dbs, self._pid = env, dbs, pid

    def write(self, body: Callable[[lmdb.Transaction, dict[str, Any]], T]) -> T:
        """Runs ``body(txn, dbs)`` in one write transaction and commits it, growing the map and
        rerunning the whole body as often as LMDB reports it full. ``body`` must only mutate
        the transaction."""
        env, dbs = self._opened()
        return self._retry(env, lambda txn: body(txn, dbs))

    def _retry(self, env: lmdb.Environment, body: Callable[[lmdb.Transaction], T]) -> T:
        for _ in range(MAX_GROWTHS):
            try:
                with env.begin(write=True) as txn:
                    return body(txn)
            except lmdb.MapFullError:
                self._grow(env)
            except lmdb.MapResizedError:
                env.set_mapsize(0)  # another process grew it: adopt the new size
        raise LibraryFullError(f"{self.path}: the map is still full after {MAX_GROWTHS} "
                               f"doublings; free disk space or lower the library's max_calls")

    def _grow(self, env: lmdb.Environment) -> None:
        size = env.info()["map_size"]
        try:
            env.set_mapsize(size * 2)
        except lmdb.Error as error:
            raise LibraryFullError(f"{self.path}: cannot grow the map past {size} bytes "
                                   f"({error}); free disk space or lower max_calls") from None

    def begin_read(self) -> tuple[lmdb.Transaction, dict[str, Any]]:
        """A read transaction over the latest committed state, with the named databases; the
        caller must ``abort()`` it soon (a long-lived reader makes the file grow)."""
        env, dbs = self._opened()
        try:
            return env.begin(), dbs
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # another process grew the map past ours: adopt its size
            return env.begin(), dbs

    @contextmanager
    def read(self) -> Iterator[tuple[lmdb.Transaction, dict[str, Any]]]:
        """A short read transaction over the latest committed state, with the named databases."""
        txn, dbs = self.begin_read()
        try:
            yield txn, dbs
        finally:
            txn.abort()

    def map_size(self) -> int:
        return self._opened()[0].info()["map_size"]

    def used_bytes(self) -> int:
        env = self._opened()[0]
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]

    def disk_bytes(self) -> int:
        return sum(f.stat().st_blocks * 512 for f in self.path.iterdir() if f.is_file())
