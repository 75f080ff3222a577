"""A replica's prefix cache: prompt keys and values kept in fixed-size token blocks, shared by
every request of a tenant whose prompt starts with the same blocks.

Tool-calling traffic repeats itself: an application sends the same system prompt and the same
``tools`` with every request, and each turn of a conversation starts with the one before it.
As in vLLM's automatic prefix caching, a prompt is cut into blocks of ``block_tokens`` tokens
and each full block is keyed by a hash chained over the tenant and the tokens of every block up
to it (``block_keys``), so two prompts share exactly the blocks of their common start, and a
tenant's blocks are never another tenant's (the chain starts from the tenant's name; a shared
prefix would also leak timing). A request takes the longest chain of cached blocks its prompt
starts with and prefills only the rest; every prompt block it computes is inserted as soon as
its forward has run, so a request arriving while another computes the same prompt waits one
step and takes its blocks (``Engine.step``).

Exact: the target model attends a prompt one block at a time (``TargetModel``: each block in a
call of its own, keys up to its end), so a block's keys and values do not depend on how the
prompt was chunked or how much of it came from here — in fp32 a request served from a partly
cached prompt gives bitwise the output of a cold prefill. Only rows computed as prompt rows are
inserted: an output's rows come from decoding steps, whose attention runs in other shapes.

The index lives here (hashes, tokens, least recently used order, bytes); the keys and values
live with the model (``BlockStore``: a split model keeps each rank's part on that rank).
Blocks are copied into a request's own cache when taken, so a cached block is never written and
evicting one never fails a request. Mutates: the index and the store's blocks; one thread at a
time (the replica's scheduler thread).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_BLOCK_TOKENS = 32  # tokens per block: hits are whole blocks; see docs/serving.md
_KEY_BYTES = 16


def block_keys(tenant: str, tokens: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS
               ) -> list[bytes]:
    """The key of every full block of ``tokens``: a hash of the previous block's key (the
    tenant's name before the first) and this block's tokens. Equal keys at block ``i`` mean
    equal tenants and equal first ``(i + 1) * block_tokens`` tokens (up to a 128-bit hash
    collision, which ``PrefixCache`` also rules out by comparing tokens)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    key = hashlib.blake2b(f"toolspec-prefix\0{tenant}".encode(), digest_size=_KEY_BYTES).digest()
    keys = []
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        block = array("q", tokens[start: start + block_tokens]).tobytes()
        key = hashlib.blake2b(key + block, digest_size=_KEY_BYTES).digest()
        keys.append(key)
    return keys


class BlockStore(Protocol):
    """Where a model keeps cached blocks' keys and values (``TargetModel`` and its split
    variant implement it)."""

    def save_block(self, cache: Any, start: int, end: int) -> Any:
        """A copy of rows ``start..end`` of ``cache`` (every layer), as a stored block."""

    def saved_bytes(self, cache: Any, start: int, end: int) -> int:
        """Memory ``save_block(cache, start, end)`` would take (nothing is copied)."""

    def load_blocks(self, cache: Any, blocks: Sequence[Any]) -> None:
        """Append ``blocks``' rows, in order, to ``cache``. Mutates: ``cache``."""

    def drop_block(self, block: Any) -> None:
        """Let go of a stored block (evicted)."""

    def block_bytes(self, block: Any) -> int:
        """Memory a stored block holds."""


@dataclass
class _Entry:
    parent: bytes | None
    tokens: tuple[int, ...]
    block: Any
    nbytes: int


@dataclass(frozen=True)
class PrefixCacheStats:
    """What the cache holds and has done since it was made."""

    blocks: int
    bytes: int
    budget_bytes: int
    block_tokens: int
    hit_blocks: int  # blocks requests took from the cache
    missed_blocks: int  # full prompt blocks requests looked up and had to compute
    inserted_blocks: int
    evicted_blocks: int

    @property
    def hit_rate(self) -> float:
        looked_up = self.hit_blocks + self.missed_blocks
        return self.hit_blocks / looked_up if looked_up else 0.0


class PrefixCache:
    """Blocks of prompt keys and values by chained key, least recently used evicted first
    under ``budget_bytes``.

    Parents are always used more recently than their children (a chain is touched from its
    deepest block up to its first), so the least recently used block is a leaf and evicting
    it never orphans a cached block below it. The budget is never exceeded, not even while a
    block is copied: room is made before each copy. A budget smaller than one block caches
    nothing.
    """

    def __init__(self, store: BlockStore, budget_bytes: int,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.store = store
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0
        self.hit_blocks = 0
        self.missed_blocks = 0
        self.inserted_blocks = 0
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._entries)

    def cached_blocks(self, keys: Sequence[bytes], tokens: Sequence[int], first: int,
                      limit: int) -> int:
        """How many blocks from block ``first`` on (at most up to block ``limit``) are cached
        for the prompt whose block keys are ``keys`` and tokens ``tokens``."""
        count = 0
        for index in range(first, min(limit, len(keys))):
            if self._entry(keys, tokens, index) is None:
                break
            count += 1
        return count

    def take(self, cache: Any, keys: Sequence[bytes], tokens: Sequence[int], first: int,
             count: int) -> None:
        """Append blocks ``first .. first + count`` (all cached: see ``cached_blocks``) to
        ``cache``, which holds exactly the blocks before them. Mutates: ``cache``, the
        recency order, the hit counter."""
        entries = [self._entry(keys, tokens, index) for index in range(first, first + count)]
        if any(entry is None for entry in entries):
            raise KeyError("a block to take is not cached (ask cached_blocks first)")
        self.store.load_blocks(cache, [entry.block for entry in entries])  # type: ignore[union-attr]
        self._touch_chain(keys, first + count)
        self.hit_blocks += count

    def count_missed(self, blocks: int) -> None:
        """Record prompt blocks a request looked up and computed itself."""
        self.missed_blocks += blocks

    def insert(self, cache: Any, keys: Sequence[bytes], tokens: Sequence[int], first: int,
               end: int) -> int:
        """Keep blocks ``first .. end`` of a prompt whose rows ``cache`` holds (computed as
        prompt rows); blocks already cached are only touched. Before each copy, evicts the
        least recently used blocks of other prompts until it fits the budget; where it
        cannot, the prompt keeps the blocks it has so far (a chain's first blocks are the
        ones others share). Returns how many blocks were added; an exception from the store
        leaves the index whole and within budget. Mutates: the index, the store."""
        added = 0
        size = self.block_tokens
        end = min(end, len(keys))
        chain = set(keys[:end])  # its own blocks: never evicted to make room for it
        try:
            for index in range(first, end):
                if keys[index] in self._entries:
                    continue
                if index and keys[index - 1] not in self._entries:
                    break  # its parent was evicted meanwhile: the chain cannot reach it
                start, stop = index * size, (index + 1) * size
                if not self._make_room(self.store.saved_bytes(cache, start, stop), chain):
                    break
                block = self.store.save_block(cache, start, stop)
                nbytes = self.store.block_bytes(block)
                self._entries[keys[index]] = _Entry(keys[index - 1] if index else None,
                                                    tuple(tokens[start:stop]), block, nbytes)
                self._bytes += nbytes
                added += 1
        finally:
            self.inserted_blocks += added
            self._touch_chain(keys, end)
            self._evict()  # only if a block took more than it said it would
        return added

    def clear(self) -> None:
        """Drop every block. Mutates: the index, the store."""
        while self._entries:
            self._pop_oldest()

    def resize(self, budget_bytes: int) -> None:
        """Hold at most ``budget_bytes`` from now on: the least recently used blocks beyond it
        are dropped through the store (a tensor-parallel store drops them on every rank).
        Mutates: the budget, the index, the store."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._evict()

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(len(self._entries), self._bytes, self.budget_bytes,
                                self.block_tokens, self.hit_blocks, self.missed_blocks,
                                self.inserted_blocks, self.evicted_blocks)

    def _entry(self, keys: Sequence[bytes], tokens: Sequence[int], index: int) -> _Entry | None:
        entry = self._entries.get(keys[index])
        size = self.block_tokens
        if entry is None or entry.parent != (keys[index - 1] if index else None) \
                or entry.tokens != tuple(tokens[index * size:(index + 1) * size]):
            return None  # absent, or (never seen in practice) a hash collision
        return entry

    def _touch_chain(self, keys: Sequence[bytes], end: int) -> None:
        """Mark blocks ``0 .. end`` used now, deepest first, so parents end up more recent."""
        for index in range(end - 1, -1, -1):
            if keys[index] in self._entries:
                self._entries.move_to_end(keys[index])

    def _evict(self) -> None:
        while self._bytes > self.budget_bytes and self._entries:
            self._pop_oldest()
            self.evicted_blocks += 1

    def _make_room(self, nbytes: int, keep: set[bytes]) -> bool:
        """Evict the least recently used blocks not in ``keep`` until ``nbytes`` more fit the
        budget; False (nothing evicted) when they cannot. ``keep`` is a chain from its first
        block, so a block outside it has no kept block below it: it is a leaf, or the
        parent of leaves evicted before it."""
        if nbytes > self.budget_bytes:
            return False
        victims, freed = [], 0
        for key, entry in self._entries.items():  # least recently used first
            if self._bytes - freed + nbytes <= self.budget_bytes:
                break
            if key not in keep:
                victims.append(key)
                freed += entry.nbytes
        if self._bytes - freed + nbytes > self.budget_bytes:
            return False
        for key in victims:
            self._drop(key)
            self.evicted_blocks += 1
        return True

    def _pop_oldest(self) -> None:
        self._drop(next(iter(self._entries)))

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        self.store.drop_block(entry.block)
