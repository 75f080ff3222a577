"""Per-session KV prefix caches: the next turn of a conversation prefills only what is new.

After a request of a session, its cache (prompt + output) is kept under the session id. The
next turn's prompt usually starts with the same tokens (the earlier messages and the answer as
the chat template renders it); the longest common token prefix is reused and only the rest is
prefilled. Where the template renders the answer differently from how it was generated (a
tool call re-serialised), reuse stops at the first differing token: never wrong, only shorter.

Chunked prefill (cached prefix + the rest) computes the same attention as one prefill; float
round-off may differ in the last bits, which can flip a near-tie greedy choice (as bf16 vs fp32
does).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import DynamicCache

from toolspec.engine import KVPrefix
from toolspec.target_model import truncate_cache


def cache_bytes(kv: KVPrefix) -> int:
    return sum(layer.keys.numel() * layer.keys.element_size()
               + layer.values.numel() * layer.values.element_size()
               for layer in kv.cache.layers if layer.keys is not None)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


@dataclass(frozen=True)
class SessionKVStats:
    sessions: int
    bytes: int
    hits: int
    misses: int
    reused_tokens: int


class SessionKVStore:
    """Caches by session id, least recently used evicted first, under ``budget_bytes``.

    ``min_reuse``: a shorter common prefix is not worth keeping the entry for. Mutates: the
    entries (``take`` removes one: a cache serves one request at a time) and the counters.
    """

    def __init__(self, budget_bytes: int, min_reuse: int = 16,
                 truncate: Callable[[DynamicCache, int], None] = truncate_cache) -> None:
        self.budget_bytes = budget_bytes
        self.min_reuse = min_reuse
        self.truncate = truncate  # the model's own (a sharded model cuts every rank's copy)
        self._entries: OrderedDict[str, tuple[KVPrefix, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def take(self, session_id: str, prompt_ids: Sequence[int]) -> KVPrefix | None:
        """The session's cache cut to its common prefix with ``prompt_ids`` (at least one
        prompt token is left to prefill), or None."""
        entry = self._entries.pop(session_id, None)
        if entry is None:
            self.misses += 1
            return None
        kv, size = entry
        self._bytes -= size
        reuse = min(common_prefix(kv.tokens, prompt_ids), len(prompt_ids) - 1)
        if reuse < self.min_reuse:
            self.misses += 1
            return None
        self.truncate(kv.cache, reuse)
        self.hits += 1
        self.reused_tokens += reuse
        return KVPrefix(tuple(prompt_ids[:reuse]), kv.cache)

    def put(self, session_id: str, kv: KVPrefix) -> None:
        """Keep ``kv`` for the session's next turn, evicting the least recently used."""
        old = self._entries.pop(session_id, None)
        if old is not None:
            self._bytes -= old[1]
        size = cache_bytes(kv)
        if size > self.budget_bytes:
            return
        self._entries[session_id] = (kv, size)
        self._bytes += size
        while self._bytes > self.budget_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted

    def stats(self) -> SessionKVStats:
        return SessionKVStats(len(self._entries), self._bytes, self.hits, self.misses,
                              self.reused_tokens)
