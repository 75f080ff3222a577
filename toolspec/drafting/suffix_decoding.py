"""SuffixDecoding (Oliaro et al., 2024; ArcticInference, vLLM ``suffix``): frequency-scored trees.

Two suffix tries count what followed what: a global one over the outputs of earlier requests (a
bounded FIFO cache) and one over the current request (prompt + output, grown as it decodes; read
from token positions, ``SuffixPositions``, so starting a request builds no nodes).
For each suffix of the context found in a trie (its *match*), a draft tree is grown below the
match node best-first by empirical probability (child count / parent count, multiplied along the
path), at most ``max_spec_factor * match + max_spec_offset`` nodes and none below
``min_token_prob``; the tree with the most expected accepted tokens is proposed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import DraftRequest
from toolspec.drafting.best_first import Candidate, ScoredTree, best_first_tree
from toolspec.drafting.suffix_positions import SuffixPositions
from toolspec.drafting.suffix_trie import SuffixTrie

Node = TypeVar("Node")


class SuffixCounts(Protocol[Node]):
    """What drafting reads from a suffix trie: ``SuffixTrie`` and ``SuffixPositions`` both."""

    def suffix_nodes(self, context: Sequence[int]) -> list[Node]: ...

    def has_children(self, node: Node) -> bool: ...

    def candidates(self, node: Node) -> Iterable[Candidate[Node]]: ...


class SuffixOutputCache:
    """The global trie over earlier requests' outputs: a FIFO of at most ``max_cached_requests``.

    One cache can serve many drafters (a replica's concurrent requests), so what one request
    produced helps the next whichever drafter object decodes it. Mutates: the trie, on ``add``.
    """

    def __init__(self, max_depth: int = 24, max_cached_requests: int = 10_000) -> None:
        self.max_cached_requests = max_cached_requests
        self.trie = SuffixTrie(max_depth)
        self._cached: deque[tuple[int, ...]] = deque()

    def add(self, output: Sequence[int]) -> None:
        """Counts ``output``'s suffixes; evicts the oldest outputs beyond the cap."""
        if not output or self.max_cached_requests <= 0:
            return
        self.trie.add(output)
        self._cached.append(tuple(output))
        while len(self._cached) > self.max_cached_requests:
            self.trie.remove(self._cached.popleft())


class SuffixDecodingDrafter:
    """Suffix-trie drafts over past outputs and the current request.

    Parameters (vLLM / ArcticInference defaults): ``max_depth`` = 24 tokens per trie path (match
    plus draft); ``max_spec_factor`` = 1.0 and ``max_spec_offset`` = 0.0 (a match of m tokens
    drafts at most m nodes, and never more than the step's budget); ``min_token_prob`` = 0.1,
    the least path probability drafted; ``max_cached_requests`` = 10000 outputs in the global
    trie, oldest evicted first (0 disables it). ``cache`` shares the global trie with other
    drafters (then ``max_depth``/``max_cached_requests`` are the cache's). With ``learn``, a
    request's output joins the global trie at ``stop`` — never before, so it only helps later
    requests.
    Mutates: the global trie (across requests), the request's trie (per request).
    """

    name = "suffix"

    def __init__(
        self,
        max_depth: int = 24,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10_000,
        learn: bool = True,
        cache: SuffixOutputCache | None = None,
    ) -> None:
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self.learn = learn
        if cache is None:
            cache = SuffixOutputCache(max_depth, max_cached_requests)
        self.cache = cache
        self._request = SuffixPositions(self.cache.trie.max_depth)
        self._output: list[int] = []

    @property
    def global_trie(self) -> SuffixTrie:
        return self.cache.trie

    def start(self, request: DraftRequest) -> None:
        self._request = SuffixPositions(self.global_trie.max_depth)
        self._request.extend(request.prompt_ids)
        self._output = []

    def best_tree(self, context: Sequence[int], budget: int) -> ScoredTree | None:
        """The highest-scoring draft over both tries and every match length, or None."""
        best: ScoredTree | None = None
        for index in (self._request, self.global_trie):
            best = self._best_match(index, context, budget, best)
        return best

    def _best_match(self, index: SuffixCounts[Node], context: Sequence[int], budget: int,
                    best: ScoredTree | None) -> ScoredTree | None:
        nodes = index.suffix_nodes(context)
        for matched in range(len(nodes), 0, -1):
            size = min(budget, int(self.max_spec_factor * matched + self.max_spec_offset))
            node = nodes[matched - 1]
            if size <= 0 or not index.has_children(node):
                continue
            scored = best_first_tree(index.candidates, node, size, self.name, self.min_token_prob)
            if best is None or scored.expected_accepted > best.expected_accepted:
                best = scored
        return best

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return self.propose_after(context, budget)

    def propose_after(self, context: Sequence[int], budget: int) -> DraftTree:
        """The best tree after ``context``, emitted or not (``ContextDrafter``): both tries are
        read from the context's last tokens. Mutates: nothing."""
        best = self.best_tree(context, budget)
        return best.tree if best is not None else DraftTree()

    def observe(self, emitted: Sequence[int]) -> None:
        self._request.extend(emitted)
        self._output.extend(emitted)

    def stop(self) -> None:
        if self.learn:
            self.cache.add(self._output)
        self._output = []
        self._request = SuffixPositions(self.global_trie.max_depth)
