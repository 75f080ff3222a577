"""A depth-bounded suffix trie with counts: how often each short token sequence occurred.

Every substring of at most ``max_depth`` tokens of the sequences added is a path from the root;
a node's count is the number of positions where its path occurs. The count of a child over its
parent's is the empirical probability that the path continues with the child's token — what
SuffixDecoding drafts from. Sequences can be added whole (``add``), removed again (``remove``, for
a bounded cache), or grown token by token (``SuffixStream``); all three keep the same counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


class TrieNode:
    """One path of the trie: its count and its children by token."""

    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.count = 0

    def child_or_new(self, token: int) -> TrieNode:
        """The child holding ``token``, added (with count 0) if missing. Mutates: ``children``."""
        child = self.children.get(token)
        if child is None:
            child = self.children[token] = TrieNode()
        return child


class SuffixTrie:
    """Counts of every substring of up to ``max_depth`` tokens. Mutates: ``add``, ``remove``
    and the ``SuffixStream``s opened on it; ``root.count`` is the number of positions."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = TrieNode()

    def add(self, tokens: Sequence[int]) -> None:
        """Count every substring of ``tokens`` (up to ``max_depth`` long) once more."""
        for start in range(len(tokens)):
            self.root.count += 1
            node = self.root
            for token in tokens[start : start + self.max_depth]:
                node = node.child_or_new(token)
                node.count += 1

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo ``add(tokens)``; paths no longer occurring are dropped.

        Raises KeyError if ``tokens`` was not added (a path is missing)."""
        for start in range(len(tokens)):
            self.root.count -= 1
            node = self.root
            for token in tokens[start : start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    # Counts never grow along a path: everything below is gone as well.
                    del node.children[token]
                    break
                node = child

    def find(self, pattern: Sequence[int]) -> TrieNode | None:
        """The node of ``pattern`` (None if it never occurred or is longer than ``max_depth``)."""
        if len(pattern) > self.max_depth:
            return None
        node = self.root
        for token in pattern:
            child = node.children.get(token)
            if child is None:
                return None
            node = child
        return node

    def longest_suffix(self, tokens: Sequence[int]) -> int:
        """Length of the longest suffix of ``tokens`` that occurs (at most ``max_depth``)."""
        # Every substring of an occurring path occurs too, so the lengths that match form a
        # prefix of 0, 1, 2, ...: binary search.
        low, high = 0, min(len(tokens), self.max_depth)
        while low < high:
            middle = (low + high + 1) // 2
            if self.find(tokens[len(tokens) - middle :]) is not None:
                low = middle
            else:
                high = middle - 1
        return low

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every path with its count (for inspection and tests)."""
        return dict(self._paths(self.root, ()))

    def _paths(self, node: TrieNode, path: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], int]]:
        for token, child in node.children.items():
            extended = (*path, token)
            yield extended, child.count
            yield from self._paths(child, extended)


class SuffixStream:
    """Grows one sequence in a ``SuffixTrie`` token by token, counting exactly like ``add``.

    Mutates: the trie (each ``append``) and the stream's open suffixes.
    """

    def __init__(self, trie: SuffixTrie) -> None:
        self.trie = trie
        self._open: list[tuple[TrieNode, int]] = []  # suffixes still shorter than max_depth

    def append(self, token: int) -> None:
        """Extend every open suffix and start a new one with ``token``."""
        self.trie.root.count += 1
        still_open: list[tuple[TrieNode, int]] = []
        for node, depth in [*self._open, (self.trie.root, 0)]:
            child = node.child_or_new(token)
            child.count += 1
            if depth + 1 < self.trie.max_depth:
                still_open.append((child, depth + 1))
        self._open = still_open

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)
