"""Stored responses of the Responses API (``store: true``), for ``previous_response_id`` and
``GET /v1/responses/{id}``: one LMDB environment on disk, so they outlive the ingress replica
that answered them and every ingress process on the node reads the same file.

A response is kept under its tenant: another tenant asking for its id is told it does not
exist. Retention: a response older than ``max_age_s`` is gone, and past ``max_responses`` the
oldest go first (both enforced as responses are added, a bounded number per write).

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
_SWEEP_PER_WRITE = 64  # expired or surplus responses removed per write, at most


@dataclass(frozen=True)
class StoredResponse:
    """A finished response as the next turn needs it: the conversation items it saw (earlier
    turns' included, instructions not), its output items, and the whole response object."""

    id: str
    tenant: str
    created_at: float
    items: list[dict[str, Any]]  # input items, the earlier turns' first
    output: list[dict[str, Any]]
    response: dict[str, Any]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a response that continues this one starts from."""
        return [*self.items, *self.output]


class ResponseStore:
    """Responses by (tenant, id) in LMDB, with their age order for retention.

    ``map_bytes``: the file's size limit (LMDB's map size; a write past it drops the oldest
    responses and tries once more). ``clock``: seconds since the epoch (tests give their own).
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
        self.clock = clock
        self._env = lmdb.open(str(self.directory), map_size=map_bytes, max_dbs=2,
                              subdir=True, lock=True)
        self._by_id = self._env.open_db(b"responses")
        self._by_age = self._env.open_db(b"by_age")  # created_at (big-endian) + key -> key

    def close(self) -> None:
        self._env.close()

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``; drop what is past retention. Mutates: the store."""
        key = _key(stored.tenant, stored.id)
        value = json.dumps({"created_at": stored.created_at, "items": stored.items,
                            "output": stored.output, "response": stored.response},
                           ensure_ascii=False, separators=(",", ":")).encode()
        try:
            self._write(key, stored.created_at, value)
        except lmdb.MapFullError:  # the file is full: make room from the oldest, once
            self._sweep(force=max(1, self.count() // 10))
            self._write(key, stored.created_at, value)

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
                              document["output"], document["response"])

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

    def _sweep(self, force: int = 0) -> None:
        with self._env.begin(write=True) as txn:
            self._sweep_in(txn, force)

    def _sweep_in(self, txn: lmdb.Transaction, force: int = 0) -> None:
        """Delete the oldest responses while they are past their age or past the count (and
        ``force`` more), at most ``_SWEEP_PER_WRITE + force`` of them."""
        surplus = txn.stat(self._by_id)["entries"] - self.max_responses + force
        oldest_kept = self.clock() - self.max_age_s
        cursor = txn.cursor(db=self._by_age)
        removed = 0
        while removed < _SWEEP_PER_WRITE + force and cursor.first():
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
