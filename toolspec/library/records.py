"""What the call library stores: one msgpack record per distinct call, and what lookups return.

A record is keyed by the digest of (tenant, tool, canonical arguments), so the same call written
with its arguments in another order is the same record. It keeps the arguments as the model first
wrote them (key order preserved) and the text of the call object rendered with each arguments key
and JSON style the library indexes, so a lookup can hand back a continuation without re-rendering.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from toolspec.calls.formats import (
    COMPACT_STYLE,
    DEFAULT_STYLE,
    FORMATS,
    INDENTED_STYLE,
    CallFormat,
    JsonStyle,
    ToolCall,
)
from toolspec.library.errors import InvalidCallError, UnsupportedStyleError

#: The JSON styles every record is rendered in, by the name used in records and index keys.
#: Indented renderings are those of a call object starting at column 0 (a fenced block's call).
STYLES: dict[str, JsonStyle] = {"default": DEFAULT_STYLE, "compact": COMPACT_STYLE,
                                "indented": INDENTED_STYLE}
#: The arguments keys every record is rendered with, and a format whose call object uses each.
ARGUMENT_KEYS: dict[str, CallFormat] = {"arguments": FORMATS["json"],
                                        "parameters": FORMATS["llama3_json"]}
MAX_TOOL_BYTES = 200
MAX_TOKEN_ID = 2**32 - 1
RECORD_VERSION = 2  # 2: adds the indented rendering


def style_name(style: JsonStyle) -> str:
    """The name under which ``style``'s renderings are stored; raises UnsupportedStyleError."""
    for name, known in STYLES.items():
        if style == known:
            return name
    raise UnsupportedStyleError(
        f"the library keeps renderings only in {', '.join(STYLES)} style, not {style!r}")


def check_arguments_key(arguments_key: str) -> str:
    if arguments_key not in ARGUMENT_KEYS:
        raise UnsupportedStyleError(
            f"arguments key {arguments_key!r} is not rendered; "
            f"use one of {', '.join(ARGUMENT_KEYS)}")
    return arguments_key


def rendering_slot(arguments_key: str, style: JsonStyle) -> str:
    """The key of a rendering in ``CallRecord.renderings``, e.g. ``"arguments/compact"``."""
    return f"{check_arguments_key(arguments_key)}/{style_name(style)}"


def check_tool(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidCallError(f"a tool call needs a non-empty string name, got {name!r}")
    if "\0" in name or len(name.encode()) > MAX_TOOL_BYTES:
        raise InvalidCallError(
            f"tool name {name[:40]!r}… must be at most {MAX_TOOL_BYTES} UTF-8 bytes without NUL")
    return name


def canonical_arguments(arguments: Any) -> str:
    """The arguments as sorted, compact JSON: the text two calls are compared by for dedupe."""
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        raise InvalidCallError(f"arguments must be a mapping with string keys, got {arguments!r}")
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidCallError(f"arguments are not plain JSON ({error}): {arguments!r}") from None


def record_id(tenant: str, tool: str, canonical: str) -> bytes:
    """16 bytes identifying a distinct call of a tenant (stable across processes and runs)."""
    return hashlib.blake2b(f"{tenant}\0{tool}\0{canonical}".encode(), digest_size=16).digest()


def tool_tag(tool: str) -> bytes:
    """8 bytes identifying a tool name inside index values."""
    return hashlib.blake2b(tool.encode(), digest_size=8).digest()


def render_all(call: ToolCall) -> dict[str, str]:
    """The call object's text for every (arguments key, style) slot the library indexes:
    ``style.dumps(fmt.call_object(call))``."""
    return {f"{key}/{name}": style.dumps(call_format.call_object(call))
            for name, style in STYLES.items() for key, call_format in ARGUMENT_KEYS.items()}


def check_tokens(tokens: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """Token ids per tokenizer fingerprint, validated (ids are stored as uint32)."""
    checked: dict[str, tuple[int, ...]] = {}
    for fingerprint, ids in (tokens or {}).items():
        if not isinstance(fingerprint, str) or not fingerprint or "\0" in fingerprint \
                or len(fingerprint.encode()) > 64:
            raise InvalidCallError(
                f"tokenizer fingerprint {fingerprint!r} must be 1-64 UTF-8 bytes without NUL")
        try:
            ids = tuple(map(operator.index, ids))  # ints and numpy ints, not floats
        except TypeError:
            ids = (-1,)
        if not all(0 <= i <= MAX_TOKEN_ID for i in ids):
            raise InvalidCallError(f"token ids for {fingerprint!r} must be ints in [0, 2**32)")
        checked[fingerprint] = ids
    return checked


@dataclass(frozen=True)
class CallRecord:
    """One distinct call of one tenant, with its renderings, usage counts and times."""

    tenant: str
    tool: str
    canonical: str  # sorted compact arguments JSON: the dedupe key
    arguments: Mapping[str, Any]  # as first written, key order preserved
    renderings: Mapping[str, str]  # "arguments/default" etc. -> call object text
    tokens: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # fingerprint -> ids
    hits: int = 1
    first_seen: float = 0.0
    last_used: float = 0.0

    @property
    def call(self) -> ToolCall:
        return ToolCall(self.tool, self.arguments)

    @property
    def record_id(self) -> bytes:
        return record_id(self.tenant, self.tool, self.canonical)

    def rendered(self, arguments_key: str = "arguments", style: JsonStyle = DEFAULT_STYLE) -> str:
        """The call object text as written with ``arguments_key`` in ``style``."""
        return self.renderings[rendering_slot(arguments_key, style)]

    def score(self, half_life_s: float) -> float:
        """log2 of the ranking weight plus now/half-life: a number that orders records by weight
        at any later instant (see ``weight``)."""
        return math.log2(self.hits) + self.last_used / half_life_s

    def weight(self, now: float, half_life_s: float) -> float:
        """hits × 2^(-age / half-life): frequent and recent calls rank first."""
        return self.hits * 0.5 ** (max(0.0, now - self.last_used) / half_life_s)

    def hit(self, when: float, tokens: Mapping[str, tuple[int, ...]],
            usage: Usage | None = None) -> CallRecord:
        """A copy used once more at ``when`` (token ids given now replace stored ones); with
        ``usage`` (an imported record's), its hits are added and its times kept."""
        hits, first = (usage.hits, usage.first_seen) if usage is not None else (1, None)
        return replace(self, hits=self.hits + hits, last_used=max(self.last_used, when),
                       first_seen=min(self.first_seen, first) if first is not None
                       else self.first_seen, tokens={**self.tokens, **tokens})

    def used(self, when: float) -> CallRecord:
        """A copy last used at ``when`` (a lookup served it), its hits unchanged."""
        return replace(self, last_used=max(self.last_used, when))


@dataclass(frozen=True)
class Usage:
    """How often and when a call was used before it came here (an export's record)."""

    hits: int = 1
    first_seen: float | None = None
    last_used: float | None = None


def new_record(tenant: str, call: ToolCall, canonical: str, when: float,
               tokens: Mapping[str, tuple[int, ...]], usage: Usage | None = None) -> CallRecord:
    """A record first seen at ``when``, or as ``usage`` says (then ``when`` is its last use)."""
    hits = usage.hits if usage is not None else 1
    first = usage.first_seen if usage is not None and usage.first_seen is not None else when
    return CallRecord(tenant=tenant, tool=call.name, canonical=canonical,
                      arguments=dict(call.arguments), renderings=render_all(call),
                      tokens=dict(tokens), hits=hits, first_seen=min(first, when),
                      last_used=when)


def pack_record(record: CallRecord) -> bytes:
    try:
        return msgpack.packb({
            "v": RECORD_VERSION, "t": record.tenant, "n": record.tool, "c": record.canonical,
            "a": record.arguments, "r": record.renderings,
            "k": {fp: list(ids) for fp, ids in record.tokens.items()},
            "h": record.hits, "f": record.first_seen, "l": record.last_used,
        }, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as error:
        raise InvalidCallError(f"call {record.tool!r} cannot be stored with msgpack "
                               f"({error}); integers must fit in 64 bits") from None


def unpack_record(data: bytes) -> CallRecord:
    raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    renderings = raw["r"]
    if raw["v"] < RECORD_VERSION:  # older records lack newer styles' renderings
        renderings = {**render_all(ToolCall(raw["n"], raw["a"])), **renderings}
    return CallRecord(tenant=raw["t"], tool=raw["n"], canonical=raw["c"], arguments=raw["a"],
                      renderings=renderings,
                      tokens={fp: tuple(ids) for fp, ids in raw["k"].items()},
                      hits=raw["h"], first_seen=raw["f"], last_used=raw["l"])


@dataclass(frozen=True)
class LibraryMatch:
    """A stored call that extends the text typed so far."""

    continuation: str  # the stored rendering minus the typed prefix (never empty)
    weight: float  # hits × recency decay at lookup time
    record: CallRecord


@dataclass(frozen=True)
class LibraryStats:
    """A snapshot of a library's size."""

    calls: int  # distinct records
    tenants: int
    tools: int  # distinct tool names over all tenants
    shard_calls: tuple[int, ...]
    disk_bytes: int  # blocks allocated to the shard files
    used_bytes: int  # pages in use inside the shard files
    map_sizes: tuple[int, ...]
