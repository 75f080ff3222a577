"""A depth-bounded suffix trie of one growing sequence, read from token positions, never built.

SuffixDecoding counts how often every substring of at most ``max_depth`` tokens occurs in the
current request (its prompt, then its output). Building those trie nodes costs ``max_depth``
dictionary inserts and objects per token: for a prompt of a few hundred tokens that is tens of
milliseconds of Python on the request path, and hundreds of thousands of objects for the
garbage collector to walk. This index stores only where each token occurs. A substring's node is
the list of positions where its occurrences end, found by filtering its last token's positions
backwards; a node's children group those positions by the token that follows. Counts, child
probabilities and the order of children (first occurrence first) equal those of the
``SuffixTrie`` holding the same sequence (tested), so the drafts do too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from toolspec.drafting.best_first import Candidate


@dataclass(frozen=True)
class Occurrences:
    """One trie node: a substring of ``depth`` tokens, by where its occurrences end (ascending)."""

    depth: int
    ends: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.ends)


class SuffixPositions:
    """Suffix-trie queries over one sequence. Mutates: the sequence, on ``extend``."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.tokens: list[int] = []
        self._positions: dict[int, list[int]] = {}

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            positions = self._positions.get(token)
            if positions is None:
                positions = self._positions[token] = []
            positions.append(len(self.tokens))
            self.tokens.append(token)

    def suffix_nodes(self, context: Sequence[int]) -> list[Occurrences]:
        """The nodes of ``context``'s suffixes that occur: entry i is the suffix of i + 1 tokens.

        Every longer suffix that occurs extends a shorter one, so the list stops at the first
        length that does not occur (or at ``max_depth``)."""
        if not context:
            return []
        ends = self._positions.get(context[-1], ())
        nodes: list[Occurrences] = []
        tokens = self.tokens
        for depth in range(1, min(len(context), self.max_depth) + 1):
            if depth > 1:
                wanted = context[-depth]
                ends = [end for end in ends
                        if end >= depth - 1 and tokens[end - depth + 1] == wanted]
            if not ends:
                break
            nodes.append(Occurrences(depth, tuple(ends)))
        return nodes

    def has_children(self, node: Occurrences) -> bool:
        # Ends ascend, so some occurrence is followed by a token unless the only one ends last.
        return node.depth < self.max_depth and node.ends[0] + 1 < len(self.tokens)

    def candidates(self, node: Occurrences) -> Iterator[Candidate[Occurrences]]:
        """Each token seen after ``node``, its share of ``node``'s occurrences, and its node."""
        if node.depth >= self.max_depth:
            return
        last = len(self.tokens) - 1
        following: dict[int, list[int]] = {}
        for end in node.ends:
            if end < last:
                following.setdefault(self.tokens[end + 1], []).append(end + 1)
        for token, ends in following.items():
            yield token, len(ends) / node.count, Occurrences(node.depth + 1, tuple(ends))
