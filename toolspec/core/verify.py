"""Verification's acceptance walk (the forward that feeds it is ``TargetModel.forward``, run by
``Engine.step`` for every job of a step at once).

Acceptance is a single rule for greedy and sampled decoding alike: starting at the root, choose
the target model's next token from the current row's logits (argmax, or one draw from the target
distribution); if a child of the current node holds that token, move there and repeat, otherwise
stop and emit the chosen token as the bonus. Every emitted token is thus chosen by the target
model from its own distribution given the accepted prefix, which is exactly what plain decoding
does — lossless for greedy, distribution-exact for sampling with deterministic draft trees.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.sampling import TokenChooser


@dataclass(frozen=True)
class AcceptedPath:
    """The outcome of walking a draft tree with the target's choices."""

    nodes: tuple[int, ...]  # accepted draft nodes, root's child first
    bonus: int  # the target's own token after the last accepted node

    @property
    def rows(self) -> tuple[int, ...]:
        """Forward rows whose keys/values stay in the cache: the root and the accepted nodes."""
        return (0, *(node + 1 for node in self.nodes))


def walk_tree(tree: DraftTree, chooser: TokenChooser) -> AcceptedPath:
    """Longest path along which each draft token equals the target's choice at its parent."""
    nodes: list[int] = []
    node = ROOT
    while True:
        token = chooser.choose(node + 1)
        child = tree.child(node, token)
        if child is None:
            return AcceptedPath(tuple(nodes), token)
        nodes.append(child)
        node = child
