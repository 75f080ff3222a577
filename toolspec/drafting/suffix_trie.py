"""A depth-bounded suffix trie with counts: how often each short token sequence occurred.

Every substring of at most ``max_depth`` tokens of the sequences added is a path from the root;
a node's count is the number of positions where its path occurs. The count of a child over its
parent's is the empirical probability that the path continues with the child's token — what
SuffixDecoding drafts from. Sequences are added whole (``add``) and removed again (``remove``, for
a bounded cache). One growing sequence is better served by ``SuffixPositions``, which answers the
same queries without building nodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from toolspec.drafting.best_first import Candidate


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
    """Counts of every substring of up to ``max_depth`` tokens. Mutates: ``add`` and ``remove``;
    ``root.count`` is the number of positions."""

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

    def suffix_nodes(self, context: Sequence[int]) -> list[TrieNode]:
        """The nodes of ``context``'s suffixes that occur: entry i is the suffix of i + 1 tokens."""
        nodes: list[TrieNode] = []
        for length in range(1, min(len(context), self.max_depth) + 1):
            node = self.find(context[len(context) - length:])
            if node is None:
                break
            nodes.append(node)
        return nodes

    @staticmethod
    def has_children(node: TrieNode) -> bool:
        return bool(node.children)

    @staticmethod
    def candidates(node: TrieNode) -> Iterator[Candidate[TrieNode]]:
        """Each token seen after ``node``, its share of ``node``'s occurrences, and its node."""
        for token, child in node.children.items():
            yield token, child.count / node.count, child

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every path with its count (for inspection and tests)."""
        return dict(self._paths(self.root, ()))

    def _paths(self, node: TrieNode, path: tuple[int, ...]
               ) -> Iterator[tuple[tuple[int, ...], int]]:
        for token, child in node.children.items():
            extended = (*path, token)
            yield extended, child.count
            yield from self._paths(child, extended)
