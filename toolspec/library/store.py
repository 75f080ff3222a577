"""``CallLibrary``: a sharded LMDB store of past tool calls that drafters query for whole calls.

A library is a directory with ``library.json`` (settings fixed at creation, see ``metadata``) and
one LMDB environment per shard (``shard-00``, ``shard-01``, …). The shard of a call is a stable
hash of (tenant, tool), so every call of one tool of one tenant lives in one shard and a lookup
that knows the tool reads one environment. Environments open lazily in the process that uses them
(see ``shards.py``): many processes may read and write one library; LMDB serialises the writers of
each shard.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from types import TracebackType

from toolspec.calls.formats import DEFAULT_STYLE, JsonStyle, ToolCall
from toolspec.library import keys, query, transfer
from toolspec.library.errors import InvalidCallError, LibraryClosedError, ShardNotOwnedError
from toolspec.library.index import PendingCall, evict_lru, prepare, store_call, touch_record
from toolspec.library.metadata import open_metadata
from toolspec.library.records import (
    CallRecord,
    LibraryMatch,
    LibraryStats,
    check_arguments_key,
    check_tokens,
    check_tool,
    rendering_slot,
    style_name,
    tool_tag,
    unpack_record,
)
from toolspec.library.shards import EnvOptions, ShardEnv
from toolspec.library.transfer import ImportedCall

DEFAULT_MAP_SIZE = 256 * 2**20  # per shard, to start with; grows by doubling when full
DEFAULT_SCAN_CAP = 512
BATCH = 10_000


class CallLibrary:
    """Past tool calls per tenant, deduplicated, ranked by use, looked up by typed prefix."""

    def __init__(self, path: str | Path, shards: int | None = None, max_calls: int | None = None,
                 map_size: int = DEFAULT_MAP_SIZE, *, half_life_s: float | None = None,
                 scan_cap: int = DEFAULT_SCAN_CAP, sync: bool = True,
                 max_readers: int = 126, clock: Callable[[], float] = time.time,
                 part: tuple[int, int] | None = None) -> None:
        """Opens (creating if needed) the library at ``path``.

        ``shards``: the shard count; None takes the stored one (8 for a new library); another
        count than the stored one raises ShardCountMismatchError. ``max_calls``: keep at most
        this many records, evicting the least recently used. ``map_size``: initial LMDB map size
        per shard (it grows when full). ``half_life_s``: how fast unused calls lose weight
        (fixed at creation like ``shards``: None takes the stored one, one week for a new one).
        ``scan_cap``: index entries a lookup reads at most. ``sync``: fsync every commit.
        ``clock``: the time calls are stamped and weighed at (replays and tests fix it, so
        the same calls rank the same whenever they run). ``part``: (index, count) — this
        object serves only the shards ``s`` with ``s % count == index`` (one of ``count``
        processes sharing the library out; ``max_calls`` then caps its part); a call of another
        part raises ShardNotOwnedError.
        """
        if max_calls is not None and max_calls < 1:
            raise ValueError(f"max_calls must be None (no cap) or at least 1, got {max_calls}")
        self.path = Path(path)
        settings = open_metadata(self.path, shards, half_life_s)
        self.shards = settings.shards
        self.half_life_s = settings.half_life_s
        self.max_calls = max_calls
        self.scan_cap = scan_cap
        self.clock = clock
        index, count = part if part is not None else (0, 1)
        if not 0 <= index < count:
            raise ValueError(f"part must be (index, count) with 0 <= index < count, got {part}")
        self.part = (index, count)
        options = EnvOptions(map_size=map_size, sync=sync, max_readers=max_readers)
        self._envs: dict[int, ShardEnv] | None = {
            i: ShardEnv.acquire(self.path / f"shard-{i:02d}", options)
            for i in range(self.shards) if i % count == index}

    # -- lifecycle -------------------------------------------------------------------------

    def _owned(self) -> dict[int, ShardEnv]:
        if self._envs is None:
            raise LibraryClosedError(f"the call library at {self.path} is closed; open a new one")
        return self._envs

    def _shards(self) -> list[ShardEnv]:
        """The environments this object serves, in shard order (every shard unless a part)."""
        return list(self._owned().values())

    def _env(self, shard: int) -> ShardEnv:
        env = self._owned().get(shard)
        if env is None:
            raise ShardNotOwnedError(
                f"shard {shard} belongs to part {shard % self.part[1]} of {self.part[1]}, not to "
                f"this one ({self.part[0]})")
        return env

    def owns(self, tenant: str, tool: str) -> bool:
        """Whether (``tenant``, ``tool``)'s calls are in a shard this object serves."""
        return keys.shard_of(tenant, tool, self.shards) % self.part[1] == self.part[0]

    def close(self) -> None:
        """Releases this object's hold on the shard environments (idempotent)."""
        envs, self._envs = self._envs, None
        for env in (envs or {}).values():
            env.release()

    def __enter__(self) -> CallLibrary:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CallLibrary {self.path} shards={self.shards} max_calls={self.max_calls}>"

    # -- writes ----------------------------------------------------------------------------

    def add(self, call: ToolCall, tenant: str = "default",
            tokens: Mapping[str, Sequence[int]] | None = None,
            when: float | None = None) -> CallRecord:
        """Stores ``call`` for ``tenant`` and returns its record; commits one transaction.

        An identical stored call (same tenant, tool and canonical arguments) gets one more hit
        and its last-used time set to ``when`` (default now) instead of a duplicate. ``tokens``
        maps a tokenizer fingerprint to the call's token ids (replacing stored ids). May evict
        least-recently-used calls when ``max_calls`` is set.
        """
        pending = prepare(call, tenant, tokens, self.shards)
        moment = keys.check_when(self.clock() if when is None else when)
        record = self._env(pending.shard).write(
            lambda txn, dbs: store_call(txn, dbs, pending, moment, self.half_life_s))
        self._enforce_cap()
        return record

    def remember(self, calls: Iterable[ToolCall], offered: Collection[str], tenant: str,
                 on_invalid: Callable[[ToolCall, InvalidCallError], None] | None = None
                 ) -> list[CallRecord]:
        """Store a finished request's calls: the one way finished calls reach a library (the
        benchmark, the simulator and a replica's library cache all call it). Only calls to a
        tool the request ``offered`` are kept (a call to any other name was never a call of
        that tool); a call the library refuses (``InvalidCallError``: too large, not JSON) is
        skipped and handed to ``on_invalid`` (default: raised). Returns the stored records.
        Mutates: the library (one transaction per call).
        """
        stored = []
        for call in calls:
            if call.name not in offered:
                continue
            try:
                stored.append(self.add(call, tenant))
            except InvalidCallError as error:
                if on_invalid is None:
                    raise
                on_invalid(call, error)
        return stored

    def add_many(self, calls: Iterable[tuple[ToolCall, str] | ImportedCall],
                 when: float | None = None, batch_size: int = BATCH) -> int:
        """Stores every (call, tenant) of ``calls``; returns how many were read. An item may
        carry a third element, its ``Usage`` (an export's hits and times, kept).

        Reads ``batch_size`` items at a time, validates them all, then commits one write
        transaction per shard touched. A batch is all or nothing per shard; earlier batches stay
        committed if a later one fails. Duplicates count as hits, as in ``add``.
        """
        total = 0
        iterator = iter(calls)
        while batch := list(islice(iterator, batch_size)):
            moment = keys.check_when(self.clock() if when is None else when)
            groups: dict[int, list[PendingCall]] = defaultdict(list)
            for call, tenant, *usage in batch:
                pending = prepare(call, tenant, None, self.shards, usage[0] if usage else None)
                groups[pending.shard].append(pending)
            envs = {shard: self._env(shard) for shard in groups}  # all owned, or none written
            for shard, group in sorted(groups.items()):
                envs[shard].write(lambda txn, dbs, group=group, moment=moment: [
                    store_call(txn, dbs, pending, moment, self.half_life_s) for pending in group])
            total += len(batch)
            self._enforce_cap()
        return total

    def touch(self, records: Iterable[CallRecord], when: float | None = None) -> int:
        """Marks ``records`` used at ``when`` (default now) without a hit: a lookup served
        them, so they move up the LRU order (and rank as recent). One write transaction per
        shard touched; records evicted meanwhile are skipped. Returns how many were found."""
        moment = keys.check_when(self.clock() if when is None else when)
        groups: dict[int, set[bytes]] = defaultdict(set)
        for record in records:
            groups[keys.shard_of(record.tenant, record.tool, self.shards)].add(record.record_id)
        found = 0
        for shard, rids in sorted(groups.items()):
            found += sum(self._env(shard).write(lambda txn, dbs, rids=rids: [
                touch_record(txn, dbs, rid, moment, self.half_life_s) for rid in sorted(rids)]))
        return found

    def _enforce_cap(self) -> None:
        """Evicts least-recently-used records until at most ``max_calls`` remain."""
        if self.max_calls is None:
            return
        shards = self._shards()
        excess = sum(query.shard_counts(shards)) - self.max_calls
        if excess <= 0:
            return
        victims: dict[int, list[bytes]] = defaultdict(list)
        for key, position in query.oldest(shards, excess):
            victims[position].append(key)
        for position, lru_keys in sorted(victims.items()):
            shards[position].write(lambda txn, dbs, lru_keys=lru_keys:
                                   evict_lru(txn, dbs, lru_keys))

    def import_file(self, path: str | Path, tenant: str = "default") -> int:
        """Adds every call in ``path`` (API-Bank JSON or JSON lines; see ``transfer``) for
        ``tenant`` unless a line names its own; returns the number of calls read. The whole
        file is parsed before anything is written."""
        return self.add_many(transfer.read_calls(path, tenant))

    # -- reads -----------------------------------------------------------------------------

    def lookup_text(self, tenant: str, typed: str, arguments_key: str = "arguments",
                    style: JsonStyle = DEFAULT_STYLE, tool: str | None = None,
                    k: int = 8) -> list[LibraryMatch]:
        """Up to ``k`` stored calls of ``tenant`` whose call-object text extends ``typed``.

        ``typed`` is the call object written so far, from its ``{``; stored calls are matched in
        their rendering with ``arguments_key`` and ``style``. ``tool`` narrows the search to one
        tool (and one shard); without it every shard is scanned. Matches come by weight (hits ×
        recency decay), best first, among the first ``scan_cap`` keys in sorted order. Reads only.
        """
        shards, tenant_key = self._shards(), keys.check_tenant(tenant)
        slot = rendering_slot(arguments_key, style)
        search, scanned = typed, shards
        if tool is not None:
            # '{"name": "tool"' as this style writes it
            name_head = "{" + style.opening_gap(1) + style.dumps("name") + style.colon \
                + style.dumps(check_tool(tool))
            if name_head.startswith(typed):
                search = name_head
            elif not typed.startswith(name_head):
                return []
            scanned = [self._env(keys.shard_of(tenant, tool, self.shards))]
        head = keys.text_head(tenant_key, check_arguments_key(arguments_key), style_name(style))
        prefix, exact = keys.text_prefix(head, search)
        now, cut = self.clock(), len(typed)

        def accept(record: CallRecord) -> LibraryMatch | None:
            text = record.renderings[slot]
            if len(text) <= cut or not text.startswith(typed):
                return None
            return LibraryMatch(text[cut:], record.weight(now, self.half_life_s), record)

        return query.best_matches(scanned, "text", prefix, self.scan_cap, k, accept, exact)

    def lookup(self, tenant: str, tool: str | None, prefix_ids: Sequence[int], k: int,
               fingerprint: str) -> list[tuple[list[int], float]]:
        """Up to ``k`` (continuation ids, weight) of stored calls of ``tenant`` (and ``tool``,
        if given) whose token ids under ``fingerprint`` start with ``prefix_ids``; best first.
        Only calls added with ids for ``fingerprint`` take part. Reads only."""
        shards, tenant_key = self._shards(), keys.check_tenant(tenant)
        prefix_ids = check_tokens({fingerprint: prefix_ids})[fingerprint]
        scanned, tag = shards, None
        if tool is not None:
            scanned = [self._env(keys.shard_of(tenant, check_tool(tool), self.shards))]
            tag = tool_tag(tool)
        prefix, exact = keys.token_prefix(keys.token_head(tenant_key, fingerprint), prefix_ids)
        now, cut = self.clock(), len(prefix_ids)

        def accept(record: CallRecord) -> tuple[list[int], float] | None:
            ids = record.tokens.get(fingerprint, ())
            if len(ids) <= cut or tuple(ids[:cut]) != prefix_ids:
                return None
            return list(ids[cut:]), record.weight(now, self.half_life_s)

        return query.best_matches(scanned, "tokens", prefix, self.scan_cap, k, accept, exact, tag)

    def top_calls(self, tenant: str, k: int = 10, tool: str | None = None) -> list[CallRecord]:
        """The ``k`` most used calls of ``tenant`` (of ``tool`` only, if given), most hits
        first, ties broken by most recent use. Reads only."""
        shards, tenant_key = self._shards(), keys.check_tenant(tenant)
        if tool is not None:
            shards = [self._env(keys.shard_of(tenant, check_tool(tool), self.shards))]
        return query.top_records(shards, tenant_key, tool, k)

    def records(self, tenant: str | None = None) -> Iterator[CallRecord]:
        """Every stored record (of ``tenant`` only, if given), shard by shard. Reads only;
        each shard is read in one transaction, so do not hold the iterator open for long, and
        do not write meanwhile (a map growth would end the transaction under it)."""
        for shard in self._shards():
            with shard.read() as (txn, dbs):
                for raw in txn.cursor(dbs["records"]).iternext(keys=False):
                    record = unpack_record(raw)
                    if tenant is None or record.tenant == tenant:
                        yield record

    def export(self, path: str | Path, tenant: str | None = None) -> int:
        """Writes the records (of ``tenant`` only, if given) to ``path`` as JSON lines that
        ``import_file`` reads back; returns how many. Replaces ``path`` atomically."""
        if tenant is not None:
            keys.check_tenant(tenant)
        return transfer.write_lines(path, self.records(tenant))

    def stats(self) -> LibraryStats:
        """Counts and sizes of the whole library (reads every shard's ``tools`` index)."""
        shards = self._shards()
        tenants: set[str] = set()
        tools: set[str] = set()
        for shard in shards:
            with shard.read() as (txn, dbs):
                for key in txn.cursor(dbs["tools"]).iternext(values=False):
                    tenant, tool = keys.split_tool_key(key)
                    tenants.add(tenant)
                    tools.add(tool)
        counts = query.shard_counts(shards)
        return LibraryStats(
            calls=sum(counts), tenants=len(tenants), tools=len(tools),
            shard_calls=tuple(counts), disk_bytes=sum(s.disk_bytes() for s in shards),
            used_bytes=sum(s.used_bytes() for s in shards),
            map_sizes=tuple(s.map_size() for s in shards))

