"""Observers of the decode loop that only measuring code needs (``toolspec.core.generation.
StepObserver``), handed to a request's job by the benchmark; the loop itself knows neither.

``MarginRecorder``: the top-1 minus top-2 logit margin behind every emitted token, to tell a
near-tie from a real difference where two methods' outputs differ.

``TopKFeedback``: drafters that learn from the target model's *candidates* (Token Recycling and
the drafters built on it, baselines in ``toolspec.bench.baselines``) get the top-k ids the
model ranked after every token of each verification forward — accepted or rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from toolspec.core.generation import StepObserver, Verification


@runtime_checkable
class LogitsObserver(Protocol):
    """A drafter that learns from the target model's top-k candidates after each token."""

    @property
    def logits_top_k(self) -> int:
        """How many candidates per row it wants (0: none, nothing is fed then)."""

    def observe_logits(self, tokens: Sequence[int], top_k_ids: Sequence[Sequence[int]]) -> None:
        """``tokens[i]`` was fed to the model and ``top_k_ids[i]`` are the ids it ranked highest
        for the next position (best first). Row 0 is the tree's root, row ``i + 1`` its node
        ``i``; rejected nodes are included. Mutates: the drafter's learned statistics."""


def logits_observer(drafter: object) -> LogitsObserver | None:
    """``drafter`` as a logits observer if it wants candidates, else None."""
    if isinstance(drafter, LogitsObserver) and drafter.logits_top_k > 0:
        return drafter
    return None


class TopKFeedback:
    """Feeds ``drafter`` the top-k ids of every row of each verification forward."""

    def __init__(self, drafter: LogitsObserver) -> None:
        self.drafter = drafter

    def verified(self, verification: Verification, logits: torch.Tensor) -> None:
        k = min(self.drafter.logits_top_k, logits.shape[-1])
        top_k_ids = torch.topk(logits, k, dim=-1).indices.tolist()
        self.drafter.observe_logits((verification.root, *verification.tree.tokens), top_k_ids)


class MarginRecorder:
    """The top-1 minus top-2 logit margin behind every token a request emitted, in order.
    Mutates: ``margins``."""

    def __init__(self) -> None:
        self.margins: list[float] = []

    def verified(self, verification: Verification, logits: torch.Tensor) -> None:
        top = torch.topk(logits[list(verification.path_rows)].float(), 2, dim=-1).values
        self.margins.extend((top[:, 0] - top[:, 1]).tolist()[: len(verification.emitted)])


def observers_for(drafter: object, margins: MarginRecorder | None = None
                  ) -> tuple[StepObserver, ...]:
    """What watches one request of the benchmark: ``margins`` if given, and logit feedback
    for a drafter that wants it."""
    observer = logits_observer(drafter)
    found: list[StepObserver] = [margins] if margins is not None else []
    if observer is not None:
        found.append(TopKFeedback(observer))
    return tuple(found)
