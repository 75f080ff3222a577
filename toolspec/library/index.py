"""Writing one record and all its index entries inside a shard's write transaction.

Every function here mutates only the LMDB transaction it is given; nothing is visible to other
transactions until the caller commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lmdb

from toolspec.calls.formats import ToolCall
from toolspec.library import keys
from toolspec.library.records import (
    ARGUMENT_KEYS,
    STYLES,
    CallRecord,
    Usage,
    canonical_arguments,
    check_tokens,
    check_tool,
    new_record,
    pack_record,
    record_id,
    tool_tag,
    unpack_record,
)

Dbs = Mapping[str, Any]


@dataclass(frozen=True)
class PendingCall:
    """A validated call on its way into a shard (computed outside any transaction);
    ``usage``: its earlier use, when it comes from an export."""

    tenant: str
    tenant_key: bytes
    call: ToolCall
    canonical: str
    rid: bytes
    shard: int
    tokens: Mapping[str, tuple[int, ...]]
    usage: Usage | None = None


def prepare(call: ToolCall, tenant: str, tokens: Mapping[str, Any] | None,
            shards: int, usage: Usage | None = None) -> PendingCall:
    """Validates ``call`` for ``tenant``; raises InvalidCallError / InvalidTenantError."""
    tenant_key = keys.check_tenant(tenant)
    tool = check_tool(getattr(call, "name", None))
    canonical = canonical_arguments(getattr(call, "arguments", None))
    return PendingCall(tenant, tenant_key, call, canonical, record_id(tenant, tool, canonical),
                       keys.shard_of(tenant, tool, shards), check_tokens(tokens), usage)


def store_call(txn: lmdb.Transaction, dbs: Dbs, pending: PendingCall, when: float,
               half_life_s: float) -> CallRecord:
    """Inserts ``pending`` as a new record, or counts a hit on the identical stored call (its
    usage's hits, for an imported one; an imported call keeps its last use, not ``when``)."""
    usage = pending.usage
    if usage is not None and usage.last_used is not None:
        when = usage.last_used
    raw = txn.get(pending.rid, db=dbs["records"])
    old = unpack_record(raw) if raw is not None else None
    if old is None:
        record = new_record(pending.tenant, pending.call, pending.canonical, when, pending.tokens,
                            usage)
        key = keys.tool_key(pending.tenant_key, record.tool)
        count = txn.get(key, db=dbs["tools"])
        txn.put(key, keys.pack_count(keys.unpack_count(count) + 1 if count else 1),
                db=dbs["tools"])
    else:
        record = old.hit(when, pending.tokens, usage)
    txn.put(pending.rid, pack_record(record), db=dbs["records"])
    _write_indexes(txn, dbs, record, pending.rid, pending.tenant_key, old, half_life_s)
    return record


def touch_record(txn: lmdb.Transaction, dbs: Dbs, rid: bytes, when: float,
                 half_life_s: float) -> bool:
    """Marks the stored record ``rid`` used at ``when`` (its LRU place and ranking move, its
    hits do not); False if it is gone."""
    raw = txn.get(rid, db=dbs["records"])
    if raw is None:
        return False
    old = unpack_record(raw)
    record = old.used(when)
    if record.last_used == old.last_used:
        return True
    txn.put(rid, pack_record(record), db=dbs["records"])
    _write_indexes(txn, dbs, record, rid, keys.check_tenant(record.tenant), old, half_life_s)
    return True


def _text_keys(record: CallRecord, tenant_key: bytes, rid: bytes) -> list[bytes]:
    return [keys.text_key(keys.text_head(tenant_key, arguments_key, style),
                          record.renderings[f"{arguments_key}/{style}"], rid)
            for arguments_key in ARGUMENT_KEYS for style in STYLES]


def _token_key(tenant_key: bytes, fingerprint: str, ids: tuple[int, ...], rid: bytes) -> bytes:
    return keys.token_key(keys.token_head(tenant_key, fingerprint), ids, rid)


def _write_indexes(txn: lmdb.Transaction, dbs: Dbs, record: CallRecord, rid: bytes,
                   tenant_key: bytes, old: CallRecord | None, half_life_s: float) -> None:
    value = keys.index_value(record.score(half_life_s), rid, tool_tag(record.tool))
    for key in _text_keys(record, tenant_key, rid):
        txn.put(key, value, db=dbs["text"])
    if old is not None:
        for fingerprint, ids in old.tokens.items():
            if record.tokens.get(fingerprint) != ids:
                txn.delete(_token_key(tenant_key, fingerprint, ids, rid), db=dbs["tokens"])
        txn.delete(keys.lru_key(old.last_used, rid), db=dbs["lru"])
        txn.delete(keys.popular_key(tenant_key, old.tool, old.hits, rid), db=dbs["popular"])
    for fingerprint, ids in record.tokens.items():
        txn.put(_token_key(tenant_key, fingerprint, ids, rid), value, db=dbs["tokens"])
    txn.put(keys.lru_key(record.last_used, rid), b"", db=dbs["lru"])
    txn.put(keys.popular_key(tenant_key, record.tool, record.hits, rid), b"", db=dbs["popular"])


def delete_record(txn: lmdb.Transaction, dbs: Dbs, rid: bytes) -> bool:
    """Removes the record ``rid`` and every index entry pointing at it; False if absent."""
    raw = txn.get(rid, db=dbs["records"])
    if raw is None:
        return False
    record = unpack_record(raw)
    tenant_key = keys.check_tenant(record.tenant)
    txn.delete(rid, db=dbs["records"])
    for key in _text_keys(record, tenant_key, rid):
        txn.delete(key, db=dbs["text"])
    for fingerprint, ids in record.tokens.items():
        txn.delete(_token_key(tenant_key, fingerprint, ids, rid), db=dbs["tokens"])
    txn.delete(keys.lru_key(record.last_used, rid), db=dbs["lru"])
    txn.delete(keys.popular_key(tenant_key, record.tool, record.hits, rid), db=dbs["popular"])
    key = keys.tool_key(tenant_key, record.tool)
    count = keys.unpack_count(txn.get(key, db=dbs["tools"])) - 1
    if count > 0:
        txn.put(key, keys.pack_count(count), db=dbs["tools"])
    else:
        txn.delete(key, db=dbs["tools"])
    return True


def evict_lru(txn: lmdb.Transaction, dbs: Dbs, lru_keys: list[bytes]) -> int:
    """Deletes the records behind ``lru_keys`` still unused since those keys were read."""
    evicted = 0
    for key in lru_keys:
        if txn.get(key, db=dbs["lru"]) is not None:
            evicted += delete_record(txn, dbs, keys.lru_rid(key))
    return evicted
