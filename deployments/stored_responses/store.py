"""Stored responses of the Responses API (``store: true``), for ``previous_response_id`` and
``GET /v1/responses/{id}``: one LMDB environment on disk, opened by one process — the
``ResponseService`` actor every ingress replica calls (``deployments.stored_responses.service``).

A response is kept under its tenant: another tenant asking for its id is told it does not
exist. It remembers the ``user`` that asked for it. Retention: a response older than
``max_age_s`` is gone, and past ``max_responses`` the oldest go first (both enforced as
responses are added, a bounded number per write). A write that finds the file full drops the
oldest responses until it fits; one response may take at most ``max_response_bytes`` (a
quarter of the file), so that always ends with it stored.

Mutates: the LMDB environment under ``directory`` (created if missing).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

_SEP = b"\0"
_SETTLE = b"\xff" * 9  # a key no response's age key can be (those start with a float)
_SWEEP_PER_WRITE = 64  # expired or surplus responses removed per write, at most
# Writes tried on a full file, each after dropping the oldest responses: LMDB reuses the pages
# a write frees from the next writes on, and a large value needs a run of them.
_FULL_FILE_TRIES = 64


class ResponseTooLargeError(ValueError):
    """A response larger than the store keeps (``limit`` bytes), even with every other one
    dropped."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the response takes {size} bytes; the response store keeps at most "
                         f"{limit} per response (a quarter of responses.max_bytes)")
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:  # raised in the store's actor, read by callers
        return type(self), (self.size, self.limit)


@dataclass(frozen=True)
class StoredResponse:
    """A finished response as the next turn needs it: the conversation items it saw (earlier
    turns' included, instructions not), its output items, the whole response object, and the
    ``user`` the request named (None: none)."""

    id: str
    tenant: str
    created_at: float
    items: list[dict[str, Any]]  # input items, the earlier turns' first
    output: list[dict[str, Any]]
    response: dict[str, Any]
    user: str | None = None

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a response that continues this one starts from."""
        return [*self.items, *self.output]


def encoded(stored: StoredResponse) -> bytes:
    """What the store writes for ``stored`` (its size is what counts against the limit)."""
    return json.dumps({"created_at": stored.created_at, "user": stored.user,
                       "items": stored.items, "output": stored.output,
                       "response": stored.response},
                      ensure_ascii=False, separators=(",", ":")).encode()


def largest_response(map_bytes: int) -> int:
    """The most one response may take in a store of ``map_bytes``: a quarter of it. LMDB
    writes a value into one run of free pages; a file that responses of every size have come
    and gone in has such a run for a quarter of it once the older responses are dropped."""
    return map_bytes // 4


class ResponseStore:
    """Responses by (tenant, id) in LMDB, with their age order for retention.

    ``map_bytes``: the file's size limit (LMDB's map size). ``clock``: seconds since the
    epoch (tests give their own).
    """

    def __init__(self, directory: str | Path, max_age_s: float = 30 * 86400,
                 max_responses: int = 100_000, map_bytes: int = 1 << 30,
                 clock: Callable[[], float] = time.time) -> None:
        if max_age_s <= 0 or max_responses < 1:
            raise ValueError("max_age_s must be > 0 and max_responses >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_age_s = max_age_s
        self.max_responses = max_responses
        self.max_response_bytes = largest_response(map_bytes)
        self.clock = clock
        self._env = lmdb.open(str(self.directory), map_size=map_bytes, max_dbs=2,
                              subdir=True, lock=True)
        self._by_id = self._env.open_db(b"responses")
        self._by_age = self._env.open_db(b"by_age")  # created_at (big-endian) + key -> key

    def close(self) -> None:
        self._env.close()

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``; drop what is past retention, and on a full file the oldest until
        it fits. Raises ResponseTooLargeError (nothing changed) past ``max_response_bytes``.
        Mutates: the store."""
        key = _key(stored.tenant, stored.id)
        value = encoded(stored)
        if len(key) + len(value) > self.max_response_bytes:
            raise ResponseTooLargeError(len(key) + len(value), self.max_response_bytes)
        for _ in range(_FULL_FILE_TRIES):
            try:
                self._write(key, stored.created_at, value)
                return
            except lmdb.MapFullError:
                # Make room from the oldest: twice this value, and a slice of the file more
                # so that the next writes do not each find it full again.
                self._drop_oldest(2 * len(value) + self._env.info()["map_size"] // 32)
        raise lmdb.MapFullError(f"no room for a response of {len(value)} bytes in "
                                f"{self.directory} after dropping the oldest")

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response ``response_id``; None when unknown, another tenant's or
        past its age."""
        with self._env.begin() as txn:
            raw = txn.get(_key(tenant, response_id), db=self._by_id)
        if raw is None:
            return None
        document = json.loads(raw)
        if document["created_at"] < self.clock() - self.max_age_s:
            return None
        return StoredResponse(response_id, tenant, document["created_at"], document["items"],
                              document["output"], document["response"],
                              document.get("user"))

    def delete(self, tenant: str, response_id: str) -> bool:
        """Forget a response; False when there was none. Mutates: the store."""
        key = _key(tenant, response_id)
        with self._env.begin(write=True) as txn:
            raw = txn.get(key, db=self._by_id)
            if raw is None:
                return False
            txn.delete(_age_key(json.loads(raw)["created_at"], key), db=self._by_age)
            txn.delete(key, db=self._by_id)
        return True

    def count(self) -> int:
        with self._env.begin() as txn:
            return txn.stat(self._by_id)["entries"]

    def _write(self, key: bytes, created_at: float, value: bytes) -> None:
        with self._env.begin(write=True) as txn:
            old = txn.get(key, db=self._by_id)
            if old is not None:
                txn.delete(_age_key(json.loads(old)["created_at"], key), db=self._by_age)
            txn.put(key, value, db=self._by_id)
            txn.put(_age_key(created_at, key), key, db=self._by_age)
            self._sweep_in(txn)

    def _drop_oldest(self, nbytes: int) -> int:
        """Delete the oldest responses until they held ``nbytes`` (or none is left); returns
        how many. Then one more (empty) commit: LMDB reuses the pages a transaction frees
        only once a later one has committed, and the next write is to use them."""
        dropped = freed = 0
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._by_age)
            while freed < nbytes and cursor.first():
                key = cursor.value()
                freed += len(key) + len(txn.get(key, db=self._by_id) or b"")
                txn.delete(key, db=self._by_id)
                cursor.delete()
                dropped += 1
        with self._env.begin(write=True) as txn:  # a page written and put back: a commit
            txn.put(_SETTLE, b"", db=self._by_age)
            txn.delete(_SETTLE, db=self._by_age)
        return dropped

    def _sweep_in(self, txn: lmdb.Transaction) -> None:
        """Delete the oldest responses while they are past their age or past the count, at
        most ``_SWEEP_PER_WRITE`` of them."""
        surplus = txn.stat(self._by_id)["entries"] - self.max_responses
        oldest_kept = self.clock() - self.max_age_s
        cursor = txn.cursor(db=self._by_age)
        removed = 0
        while removed < _SWEEP_PER_WRITE and cursor.first():
            created_at = struct.unpack(">d", cursor.key()[:8])[0]
            if surplus <= 0 and created_at >= oldest_kept:
                break
            txn.delete(cursor.value(), db=self._by_id)
            cursor.delete()
            surplus -= 1
            removed += 1


def _key(tenant: str, response_id: str) -> bytes:
    return tenant.encode() + _SEP + response_id.encode()


def _age_key(created_at: float, key: bytes) -> bytes:
    return struct.pack(">d", created_at) + key
