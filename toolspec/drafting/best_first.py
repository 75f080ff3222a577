"""Best-first draft trees: grow the likeliest nodes first until the node budget is spent.

Drafters that know a probability for each candidate next token (frequency counts of a suffix
tree, rank statistics of an adjacency matrix) all build their tree the same way: a node's reach
is the product of its and its ancestors' conditional probabilities, and the ``budget`` nodes with
the highest reach form the tree. Reach never grows along a path, so popping candidates from a
max-heap yields parents before children and every prefix of the order is a connected tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from toolspec.core.draft_tree import ROOT, DraftTree

Key = TypeVar("Key")

# (token, probability given the parent, the key whose children follow this token)
Candidate = tuple[int, float, Key]


@dataclass(frozen=True)
class ScoredTree:
    """A draft tree and its expected number of accepted tokens (the sum of node reaches)."""

    tree: DraftTree
    expected_accepted: float


def best_first_tree(
    children: Callable[[Key], Iterable[Candidate[Key]]],
    root: Key,
    budget: int,
    source: str,
    min_reach: float = 0.0,
) -> ScoredTree:
    """The ``budget`` likeliest nodes below ``root``, each node's prior its given-parent
    probability.

    ``children(key)`` lists the candidates that may follow ``key``; siblings must hold distinct
    tokens. Candidates whose reach falls below ``min_reach`` are never drafted.
    """
    tokens: list[int] = []
    parents: list[int] = []
    priors: list[float] = []
    expected = 0.0
    order = itertools.count()  # ties: first offered first, and keys are never compared
    heap: list[tuple[float, int, int, int, float, Key]] = []

    def offer(parent: int, parent_reach: float, key: Key) -> None:
        for token, probability, child_key in children(key):
            reach = parent_reach * probability
            if reach > 0.0 and reach >= min_reach:
                heapq.heappush(heap, (-reach, next(order), parent, token, probability, child_key))

    offer(ROOT, 1.0, root)
    while heap and len(tokens) < budget:
        negative_reach, _, parent, token, probability, key = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        priors.append(probability)
        expected -= negative_reach
        offer(len(tokens) - 1, -negative_reach, key)
    tree = DraftTree(tuple(tokens), tuple(parents), (source,) * len(tokens), tuple(priors))
    return ScoredTree(tree, expected)
