"""The target model as the engine sees it: prefill, a tree forward, and the KV commit.

A stock Hugging Face causal LM (Qwen2, Llama, ...) runs draft trees through a 4-D additive
attention mask and explicit position ids; no model code is patched or copied. The KV cache is a
stock ``DynamicCache`` owned by the caller (one per sequence), so plain decoding and speculative
decoding run through the same code and the same cache layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from toolspec.draft_tree import DraftTree


class TargetModel:
    """Stateless wrapper around one HF causal LM; every call names the cache it extends."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def prefill(self, cache: DynamicCache, token_ids: Sequence[int]) -> torch.Tensor:
        """Run ``token_ids`` after what ``cache`` holds; return the last position's logits ``[vocab]``.

        Mutates: ``cache`` grows by ``len(token_ids)``.
        """
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        start = cache.get_seq_length()
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device)[None]
        out = self.model(
            input_ids=ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[0, -1]

    @torch.inference_mode()
    def forward_tree(self, cache: DynamicCache, root_token: int, tree: DraftTree) -> torch.Tensor:
        """Logits ``[len(tree) + 1, vocab]`` for the root and every draft node, in one forward.

        Mutates: ``cache`` grows by ``len(tree) + 1`` rows (root first, then the nodes in tree
        order); ``commit_path`` must follow to keep only the accepted ones.
        """
        prefix = cache.get_seq_length()
        ids = tree.input_ids(root_token, self.device)
        positions = tree.position_ids(prefix, self.device)
        if len(tree) == 0:
            mask = None  # a single causal token: let the model take its fast path
        else:
            mask = tree.attention_mask(prefix, self.dtype, self.device)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        return out.logits[0]


@torch.inference_mode()
def commit_path(cache: DynamicCache, base_length: int, kept_rows: Sequence[int]) -> None:
    """Keep only ``kept_rows`` (offsets into the last forward) after ``base_length`` cached rows.

    The accepted path's keys and values are gathered to sit right after the committed prefix,
    then the cache is truncated, so it equals a cache built by feeding the path token by token.
    Mutates: every layer of ``cache``.
    """
    kept = list(kept_rows)
    if kept != sorted(set(kept)):
        raise ValueError(f"kept rows must be strictly increasing, got {kept}")
    total = cache.get_seq_length()
    if kept != list(range(len(kept))):  # rows already in place need no copy
        index = torch.tensor(kept, dtype=torch.long) + base_length
        for layer in cache.layers:
            index = index.to(layer.keys.device)
            layer.keys[..., base_length : base_length + len(kept), :] = layer.keys[..., index, :]
            layer.values[..., base_length : base_length + len(kept), :] = layer.values[..., index, :]
    surplus = total - base_length - len(kept)
    if surplus > 0:
        cache.crop(-surplus)


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` rows of ``cache``. Mutates: every layer of ``cache``."""
    surplus = cache.get_seq_length() - length
    if surplus > 0:
        cache.crop(-surplus)
