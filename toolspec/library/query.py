"""Read-only lookups: capped prefix scans over the sorted indexes, ranked by weight.

A scan reads at most ``cap`` index entries in key order (spread over the shards scanned), keeps
the largest values (a value starts with the record's sortable score, so largest = highest weight)
and only then reads those few records. Nothing here writes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import islice, repeat
from typing import Any, TypeVar

import lmdb

from toolspec.library import keys
from toolspec.library.records import CallRecord, unpack_record
from toolspec.library.shards import ShardEnv

T = TypeVar("T")


def successor(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def _scan(txn: lmdb.Transaction, db: Any, prefix: bytes, upper: bytes | None,
          take: int) -> list[bytes]:
    """The values of up to ``take`` entries under ``prefix``, in key order.

    Only values are read (in C, in growing chunks): the scan stops at the value of the last
    entry under ``prefix``, found first by stepping back from ``upper``. Within one prefix (one
    tenant and one index slot) every entry is a different record, so that value occurs once.
    """
    cursor = txn.cursor(db)
    if take <= 0:
        return []
    at_end = cursor.prev() if upper is not None and cursor.set_range(upper) else cursor.last()
    if not at_end or not cursor.key().startswith(prefix):
        return []
    last = cursor.value()
    cursor.set_range(prefix)
    entries = cursor.iternext(keys=False)
    values: list[bytes] = []
    chunk = 16
    while len(values) < take:
        got = list(islice(entries, min(chunk, take - len(values))))
        if not got:
            break
        if last in got:
            values += got[:got.index(last) + 1]
            break
        values += got
        chunk *= 4
    return values


def best_matches(shards: Sequence[ShardEnv], db: str, prefix: bytes, cap: int, k: int,
                 accept: Callable[[CallRecord], T | None], exact: bool = True,
                 tag: bytes | None = None) -> list[T]:
    """The first ``k`` results of ``accept`` over the records indexed under ``prefix`` in
    ``db`` of ``shards``, highest weight first. ``prefix`` must hold a whole index head (tenant
    and slot), so that each record appears at most once under it.

    At most ``cap`` index entries are read (the budget left by one shard passes to the next);
    entries whose tool tag is not ``tag`` (when given) are skipped but counted. With ``exact``
    every entry under ``prefix`` is known to match and ``accept`` rejects at most one (a call
    already typed in full), so only the best k+1 records are read; otherwise records are read
    best first until ``k`` are accepted. All reads happen in one read transaction per shard.
    """
    upper, remaining = successor(prefix), cap
    views = []
    try:
        values: list[bytes] = []
        owner: dict[bytes, int] = {}  # index values are unique (they hold the record id)
        for position, shard in enumerate(shards):
            views.append(shard.begin_read())
            txn, dbs = views[-1]
            found = _scan(txn, dbs[db], prefix, upper, remaining // (len(shards) - position))
            remaining -= len(found)
            if tag is not None:
                found = [value for value in found if value.endswith(tag)]
            values += found
            if len(shards) > 1:
                owner.update(zip(found, repeat(position)))
        ordered = heapq.nlargest(k + 1, values) if exact else sorted(values, reverse=True)
        results: list[T] = []
        for value in ordered:
            txn, dbs = views[owner.get(value, 0)]
            raw = txn.get(keys.value_rid(value), db=dbs["records"])
            if raw is None:
                continue
            result = accept(unpack_record(raw))
            if result is not None:
                results.append(result)
                if len(results) == k:
                    break
        return results
    finally:
        for txn, _ in views:
            txn.abort()


def top_records(shards: Sequence[ShardEnv], tenant_key: bytes, tool: str | None,
                k: int) -> list[CallRecord]:
    """The ``k`` most used records of a tenant (of ``tool`` only, when given)."""
    found: list[CallRecord] = []
    for shard in shards:
        with shard.read() as (txn, dbs):
            if tool is None:
                prefix = tenant_key + keys.SEP
                cursor = txn.cursor(dbs["tools"])
                tools = []
                if cursor.set_range(prefix):
                    for key in cursor.iternext(values=False):
                        if not key.startswith(prefix):
                            break
                        tools.append(keys.split_tool_key(key)[1])
            else:
                tools = [tool]
            for name in tools:
                prefix = keys.popular_prefix(tenant_key, name)
                cursor = txn.cursor(dbs["popular"])
                if not cursor.set_range(prefix):
                    continue
                for taken, key in enumerate(cursor.iternext(values=False)):
                    if taken >= k or not key.startswith(prefix):
                        break
                    raw = txn.get(keys.popular_rid(key), db=dbs["records"])
                    if raw is not None:
                        found.append(unpack_record(raw))
    found.sort(key=lambda record: (-record.hits, -record.last_used))
    return found[:k]


def shard_counts(shards: Sequence[ShardEnv]) -> list[int]:
    counts = []
    for shard in shards:
        with shard.read() as (txn, dbs):
            counts.append(txn.stat(dbs["records"])["entries"])
    return counts


def oldest(shards: Sequence[ShardEnv], n: int) -> list[tuple[bytes, int]]:
    """The ``n`` least recently used (lru key, shard position) pairs over all ``shards``."""
    candidates: list[tuple[bytes, int]] = []
    for position, shard in enumerate(shards):
        with shard.read() as (txn, dbs):
            for taken, key in enumerate(txn.cursor(dbs["lru"]).iternext(values=False)):
                if taken >= n:
                    break
                candidates.append((key, position))
    return heapq.nsmallest(n, candidates)
