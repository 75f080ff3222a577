"""Token Recycling's memory: per token, the top-k tokens last seen to follow it, and its tree shape.

The adjacency matrix maps a token to up to ``k`` candidate next tokens, best first. It is
rewritten from the target model's top-k candidates whenever the model saw the token (the paper's
update: the latest logits win), and a token actually observed after another is promoted to the
front of that row (the only update possible without logits, e.g. in the offline simulator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

# Children per node of Token Recycling's static 80-node draft tree (Luo et al. 2024, as used by
# the SAM-Decoding code), nodes in breadth-first order, root first; the j-th child of a node
# holds the j-th candidate of its parent token's row.
TOKEN_RECYCLING_WIDTHS: tuple[int, ...] = (
    8,
    8, 4, 3, 2, 1, 1, 1, 1,
    8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0,
    5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0,
    3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0,
    2, 1, 0, 0, 0, 0, 0, 0,
    0, 0, 0,
)


@dataclass(frozen=True)
class TreeTemplate:
    """A static tree shape: node ``i`` is the ``ranks[i]``-th candidate after its parent's token.

    ``children[p + 1]`` lists ``(rank, node)`` of the children of node ``p`` (``ROOT`` = -1).
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    children: tuple[tuple[tuple[int, int], ...], ...]

    @classmethod
    def from_widths(cls, widths: Sequence[int]) -> TreeTemplate:
        """The tree whose node ``i - 1`` (``widths[0]``: the root) has ``widths[i]`` children,
        numbered breadth-first."""
        parents: list[int] = []
        ranks: list[int] = []
        children: list[list[tuple[int, int]]] = [[] for _ in widths]
        for row, width in enumerate(widths):
            if row > len(parents):
                raise ValueError(f"node {row - 1} of the template has no parent (widths too short)")
            for rank in range(width):
                children[row].append((rank, len(parents)))
                parents.append(row - 1)
                ranks.append(rank)
        if len(parents) + 1 != len(widths):
            raise ValueError(f"{len(widths)} widths describe a tree of {len(parents)} nodes")
        return cls(tuple(parents), tuple(ranks), tuple(tuple(c) for c in children))

    def __len__(self) -> int:
        return len(self.parents)

    def children_of(self, node: int) -> tuple[tuple[int, int], ...]:
        """``(rank, child)`` pairs below ``node`` (``ROOT`` allowed)."""
        return self.children[node + 1]

    @property
    def width(self) -> int:
        """The largest rank used plus one: how many candidates per token the template reads."""
        return max(self.ranks, default=-1) + 1


TOKEN_RECYCLING_TREE = TreeTemplate.from_widths(TOKEN_RECYCLING_WIDTHS)


class AdjacencyMatrix:
    """Candidate next tokens per token, at most ``k`` per row, best first.

    Mutates: ``set_row`` and ``promote``.
    """

    def __init__(self, k: int = 8) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self._rows: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def row(self, token: int) -> tuple[int, ...]:
        return self._rows.get(token, ())

    def set_row(self, token: int, candidates: Sequence[int]) -> None:
        """Replace ``token``'s row by ``candidates`` (the model's latest top-k, best first)."""
        self._rows[token] = tuple(candidates[: self.k])

    def promote(self, token: int, following: int) -> None:
        """``following`` was seen right after ``token``: move it to the front of the row."""
        row = self._rows.get(token, ())
        if row[:1] == (following,):
            return
        self._rows[token] = ((following, *(t for t in row if t != following)))[: self.k]

    def promote_sequence(self, tokens: Sequence[int]) -> None:
        """Promote every bigram of ``tokens``, left to right."""
        for token, following in pairwise(tokens):
            self.promote(token, following)
