"""Verification: one forward over a draft tree, then the acceptance walk.

Acceptance is a single rule for greedy and sampled decoding alike: starting at the root, choose
the target model's next token from the current row's logits (argmax, or one draw from the target
distribution); if a child of the current node holds that token, move there and repeat, otherwise
stop and emit the chosen token as the bonus. Every emitted token is thus chosen by the target
model from its own distribution given the accepted prefix, which is exactly what plain decoding
does — lossless for greedy, distribution-exact for sampling with deterministic draft trees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from toolspec.draft_tree import ROOT, DraftTree
from toolspec.sampling import TokenChooser
from toolspec.target_model import TargetModel


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


@dataclass(frozen=True)
class Verification:
    path: AcceptedPath
    emitted: tuple[int, ...]  # accepted draft tokens, then the bonus token
    logits: torch.Tensor  # [len(tree) + 1, vocab], kept for diagnostics (e.g. logit margins)


def verify(
    model: TargetModel,
    cache: DynamicCache,
    pending: Sequence[int],
    tree: DraftTree,
    chooser: TokenChooser,
) -> Verification:
    """Check ``tree`` below the root, the last of the ``pending`` tokens (those not yet in
    ``cache``: the last emitted token, or the prompt at prefill), with one forward pass.

    Mutates: ``cache`` grows by ``len(pending) + len(tree)`` rows (see ``commit_path``);
    ``chooser``'s random generator advances by one draw per emitted token in sampled mode.
    """
    logits = model.forward_tree(cache, pending, tree)
    chooser.bind(logits)
    path = walk_tree(tree, chooser)
    emitted = tuple(tree.tokens[node] for node in path.nodes) + (path.bonus,)
    return Verification(path=path, emitted=emitted, logits=logits)
