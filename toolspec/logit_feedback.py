"""Logit feedback: what a verification forward can tell drafters that learn from the target.

Most drafters see only the tokens a step emitted. A few (Token Recycling and the drafters built
on it) also learn from the model's *candidates*: the top-k tokens the target model ranked after
every token it was shown — accepted or rejected — in the last forward. The engine checks once
per generation whether its drafter wants them (``logits_observer``) and, if so, hands them over
after each verification (``feed_top_k``); every other drafter costs nothing extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from toolspec.draft_tree import DraftTree


@runtime_checkable
class LogitsObserver(Protocol):
    """A drafter that learns from the target model's top-k candidates after each token."""

    @property
    def logits_top_k(self) -> int:
        """How many candidates per row it wants (0: none, the engine then feeds nothing)."""

    def observe_logits(self, tokens: Sequence[int], top_k_ids: Sequence[Sequence[int]]) -> None:
        """``tokens[i]`` was fed to the model and ``top_k_ids[i]`` are the ids it ranked highest
        for the next position (best first). Row 0 is the tree's root, row ``i + 1`` its node
        ``i``; rejected nodes are included. Mutates: the drafter's learned statistics."""


def logits_observer(drafter: object) -> LogitsObserver | None:
    """``drafter`` as a logits observer if it wants candidates, else None (checked once)."""
    if isinstance(drafter, LogitsObserver) and drafter.logits_top_k > 0:
        return drafter
    return None


def feed_top_k(
    observer: LogitsObserver, root_token: int, tree: DraftTree, logits: torch.Tensor
) -> None:
    """Give ``observer`` the top-k ids of every row of a verification forward over ``tree``.

    ``logits`` is ``[len(tree) + 1, vocab]`` as returned by ``verify``. Mutates: ``observer``.
    """
    k = min(observer.logits_top_k, logits.shape[-1])
    top_k_ids = torch.topk(logits, k, dim=-1).indices.tolist()
    observer.observe_logits((root_token, *tree.tokens), top_k_ids)
