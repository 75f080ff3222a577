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
from toolspec.grouped_attention import CAUSAL_ROWS


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
        return self._forward(cache, token_ids, DraftTree())[-1]

    def forward_tree(self, cache: DynamicCache, pending: Sequence[int], tree: DraftTree
                     ) -> torch.Tensor:
        """Logits ``[len(tree) + 1, vocab]`` for the root and every draft node, in one forward.

        ``pending``: the tokens ``cache`` does not hold yet, the last of them the tree's root —
        one token after a verification step, the whole prompt when the first tree rides on the
        prefill. Mutates: ``cache`` grows by ``len(pending) + len(tree)`` rows (pending first,
        then the nodes in tree order); ``commit_path`` must follow to keep only the accepted ones.
        """
        return self._forward(cache, pending, tree)

    @torch.inference_mode()
    def _forward(self, cache: DynamicCache, pending: Sequence[int], tree: DraftTree
                 ) -> torch.Tensor:
        if not pending:
            raise ValueError("a forward needs at least one pending token (the tree's root)")
        prefix = cache.get_seq_length()
        lead = len(pending) - 1
        ids = tree.input_ids(pending, self.device)
        positions = tree.position_ids(prefix, self.device, lead=lead)
        mask = None  # plain causal tokens: let the model take its fast path
        exact_rows: dict[str, int] = {}
        if len(tree):
            mask = tree.attention_mask(prefix, self.dtype, self.device, lead=lead)
            if lead:  # a prompt with the first tree: its rows bitwise as a plain prefill's
                exact_rows[CAUSAL_ROWS] = len(pending)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                         use_cache=True, logits_to_keep=len(tree) + 1, **exact_rows)
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
