"""What the decode loop needs of a target model: one forward over the rows of many sequences,
and the KV cache operations around it.

The loop (``toolspec.core.engine``, ``toolspec.core.job``) depends on this interface only;
``toolspec.model.target_model.TargetModel`` implements it for a Hugging Face model on one
device, ``toolspec.model.tensor_parallel.ShardedTarget`` for a model split over ranks, and the
simulator's replay verifier (``toolspec.bench.sim``) answers it from recorded outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from toolspec.core.draft_tree import DraftTree


@dataclass(frozen=True)
class SequenceRows:
    """One sequence's part of a forward: the tokens ``cache`` does not hold yet (``pending``,
    the last of them the tree's root) and a draft tree below it. ``logits``: whether the
    forward returns this sequence's logits (the root's and every node's); a prompt chunk that
    is not the prompt's last needs none. ``prompt``: the pending tokens are prompt tokens
    (attended block by block, as every prompt is); so are several pending tokens always. One
    pending token otherwise is the last emitted token of a decoding step."""

    cache: DynamicCache
    pending: tuple[int, ...]
    tree: DraftTree = field(default_factory=DraftTree)
    logits: bool = True
    prompt: bool = False

    @property
    def rows(self) -> int:
        return len(self.pending) + len(self.tree)


class TargetForward(Protocol):
    """The target model as the loop calls it. ``model``: the underlying Hugging Face model (its
    generation config names the end-of-sequence ids). ``block_tokens``: prompts are attended in
    blocks of this many positions, so prompt chunks end on block boundaries."""

    model: PreTrainedModel
    block_tokens: int

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for one sequence."""

    def forward(self, batch: Sequence[SequenceRows]) -> list[torch.Tensor | None]:
        """Run every sequence's rows in one forward; per sequence its logits (root and tree
        nodes) or None where ``logits`` is False. Mutates: each sequence's cache (the rows are
        appended; ``commit_path`` keeps the accepted ones)."""

    def commit_path(self, cache: DynamicCache, base_length: int, kept_rows: Sequence[int]
                    ) -> None:
        """Keep, of the rows after ``base_length``, only ``kept_rows`` (in order). Mutates:
        ``cache``."""
