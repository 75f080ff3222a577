"""Byte layouts of the library's sorted index keys and values, and the stable shard hash.

Sub-databases of each shard (all keys sorted bytewise by LMDB):

- ``records``: record id (16 bytes) → msgpack record.
- ``text``: ``tenant \\0 key-tag \\0 style-tag \\0 rendered text`` → index value. A prefix scan
  from the text typed so far finds every stored call extending it.
- ``tokens``: ``tenant \\0 fingerprint \\0 ids as big-endian uint32`` → index value.
- ``lru``: last-used time (µs, big-endian uint64) + record id → empty; oldest first.
- ``popular``: ``tenant \\0 tool \\0`` + (2^32-1-hits) + record id → empty; most used first.
- ``tools``: ``tenant \\0 tool`` → number of records (uint64).

An index value is a sortable encoding of the record's score (see ``CallRecord.score``) followed by
the record id and the tool tag, so the highest-weighted candidates are the largest values.
LMDB keys hold at most 511 bytes: a longer key is cut and ends in ``\\0`` + record id (text) or the
record id (tokens); lookups whose prefix reaches past the cut check the full record.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from toolspec.library.errors import InvalidCallError, InvalidTenantError

MAX_KEY = 511
SEP = b"\0"
MAX_TENANT_BYTES = 128
ARGUMENT_TAGS = {"arguments": b"a", "parameters": b"p"}
STYLE_TAGS = {"default": b"d", "compact": b"c", "indented": b"i"}
_RID = 16
_SCORE = struct.Struct(">Q")
_COUNT = struct.Struct(">Q")
_HITS = struct.Struct(">I")


def check_tenant(tenant: object) -> bytes:
    """The tenant as key bytes; raises InvalidTenantError for names keys could confuse."""
    if not isinstance(tenant, str) or not tenant:
        raise InvalidTenantError(f"a tenant must be a non-empty string, got {tenant!r}")
    data = tenant.encode()
    if SEP in data:
        raise InvalidTenantError(
            f"tenant {tenant!r} contains a NUL byte, which separates key fields; rename it")
    if len(data) > MAX_TENANT_BYTES:
        raise InvalidTenantError(
            f"tenant {tenant[:40]!r}… is over {MAX_TENANT_BYTES} UTF-8 bytes; shorten it")
    return data


def check_when(when: float) -> float:
    if not when >= 0.0 or when > 2**63 / 1e6:
        raise InvalidCallError(f"a time must be seconds since the epoch (>= 0), got {when!r}")
    return float(when)


def shard_of(tenant: str, tool: str, shards: int) -> int:
    """The shard holding (tenant, tool): a stable hash, the same in every process and run."""
    digest = hashlib.blake2b(f"{tenant}\0{tool}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def encode_score(score: float) -> bytes:
    """8 bytes that sort bytewise like ``score`` sorts numerically."""
    (bits,) = _SCORE.unpack(struct.pack(">d", score))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63
    return _SCORE.pack(bits)


def index_value(score: float, rid: bytes, tag: bytes) -> bytes:
    return encode_score(score) + rid + tag


def value_rid(value: bytes) -> bytes:
    return value[8:8 + _RID]


def text_head(tenant: bytes, arguments_key: str, style: str) -> bytes:
    return tenant + SEP + ARGUMENT_TAGS[arguments_key] + SEP + STYLE_TAGS[style] + SEP


def text_room(head: bytes) -> int:
    """How many bytes of rendered text fit in a key after ``head`` without being cut."""
    return MAX_KEY - len(head) - 1 - _RID


def text_key(head: bytes, text: str, rid: bytes) -> bytes:
    body, room = text.encode(), text_room(head)
    if len(body) <= room:
        return head + body
    return head + body[:room] + SEP + rid  # JSON text never holds a raw NUL: cut keys stay apart


def text_prefix(head: bytes, typed: str) -> tuple[bytes, bool]:
    """The scan prefix for ``typed`` and whether every key under it surely extends ``typed``."""
    body, room = typed.encode(), text_room(head)
    return head + body[:room], len(body) <= room


def token_head(tenant: bytes, fingerprint: str) -> bytes:
    return tenant + SEP + fingerprint.encode() + SEP


def token_room(head: bytes) -> int:
    """How many token ids fit in a key after ``head`` without being cut."""
    return (MAX_KEY - len(head) - _RID) // 4


def pack_ids(ids: Sequence[int]) -> bytes:
    return struct.pack(f">{len(ids)}I", *ids)


def token_key(head: bytes, ids: Sequence[int], rid: bytes) -> bytes:
    room = token_room(head)
    if len(ids) <= room:
        return head + pack_ids(ids)
    return head + pack_ids(ids[:room]) + rid  # longer than any uncut key, so never equal to one


def token_prefix(head: bytes, ids: Sequence[int]) -> tuple[bytes, bool]:
    room = token_room(head)
    return head + pack_ids(ids[:room]), len(ids) <= room


def lru_key(last_used: float, rid: bytes) -> bytes:
    return _COUNT.pack(int(last_used * 1e6)) + rid


def lru_rid(key: bytes) -> bytes:
    return key[8:]


def tool_key(tenant: bytes, tool: str) -> bytes:
    return tenant + SEP + tool.encode()


def split_tool_key(key: bytes) -> tuple[str, str]:
    tenant, _, tool = key.partition(SEP)
    return tenant.decode(), tool.decode()


def popular_prefix(tenant: bytes, tool: str) -> bytes:
    return tool_key(tenant, tool) + SEP


def popular_key(tenant: bytes, tool: str, hits: int, rid: bytes) -> bytes:
    return popular_prefix(tenant, tool) + _HITS.pack(0xFFFFFFFF - min(hits, 0xFFFFFFFF)) + rid


def popular_rid(key: bytes) -> bytes:
    return key[-_RID:]


def pack_count(count: int) -> bytes:
    return _COUNT.pack(count)


def unpack_count(value: bytes) -> int:
    return _COUNT.unpack(value)[0]
