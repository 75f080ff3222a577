"""The target model as the engine sees it: prefill, a tree forward, and the KV commit.

A stock Hugging Face causal LM (Qwen2, Llama, ...) runs the rows of several sequences — draft
trees, decoding steps, prompt chunks — in one forward: explicit position ids, and an attention
function (registered with transformers, nothing patched or copied) that attends each sequence's
rows against its own cache under its own 4-D additive mask. Each KV cache is a stock
``DynamicCache`` owned by the caller (one per sequence), so plain decoding and speculative
decoding, alone or batched, run through the same code and the same cache layout.

Prompt rows are attended one block of ``block_tokens`` positions at a time (blocks at fixed
positions: 0..B, B..2B, ...), each in a call of its own against the keys up to its end. A
block's keys and values then do not depend on how the prompt was chunked across forwards, or
on how many of its blocks came from a prefix cache (``toolspec.core.prefix_cache``, for which this
class is the ``BlockStore``): SDPA's kernels round a row by the shape of the call it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from toolspec.core.draft_tree import DraftTree
from toolspec.core.forward import SequenceRows
from toolspec.core.prefix_cache import DEFAULT_BLOCK_TOKENS
from toolspec.model.attention import (
    RAGGED_BATCH,
    PromptBlock,
    RaggedBatch,
    SequenceSpan,
    attention_implementation,
    use_grouped_tree_attention,
)


class UnsupportedModelError(ValueError):
    """A model the ragged forward cannot run (its attention is not SDPA, or it has
    sliding-window layers)."""


@dataclass(frozen=True)
class StoredBlock:
    """Rows of a KV cache kept apart (a prefix cache's block): per layer, keys and values
    ``[1, kv_heads, rows, dim]``. ``mirror_id``: its copies' name on a split model's other
    ranks (None on one rank)."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    mirror_id: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(keys.numel() * keys.element_size() + values.numel() * values.element_size()
                   for keys, values in self.layers)


class CacheOperations:
    """How the decode loop changes a model's caches after a forward, and keeps and restores
    prefix blocks (``prefix_cache.BlockStore``); a model sharded over several ranks
    (``tensor_parallel.ShardedTarget``) does it on every rank's copy."""

    def commit_path(self, cache: DynamicCache, base_length: int, kept_rows: Sequence[int]
                    ) -> None:
        """``commit_path`` on one of this model's caches."""
        commit_path(cache, base_length, kept_rows)

    def truncate(self, cache: DynamicCache, length: int) -> None:
        """``truncate_cache`` on one of this model's caches."""
        truncate_cache(cache, length)

    def save_block(self, cache: DynamicCache, start: int, end: int) -> StoredBlock:
        return copy_rows(cache, start, end)

    def saved_bytes(self, cache: DynamicCache, start: int, end: int) -> int:
        """What ``save_block`` would take: the rows' share of every layer (nothing copied)."""
        return (end - start) * sum(
            keys.element_size() * keys[..., :1, :].numel()
            + values.element_size() * values[..., :1, :].numel()
            for keys, values in ((layer.keys, layer.values) for layer in cache.layers))

    def load_blocks(self, cache: DynamicCache, blocks: Sequence[StoredBlock]) -> None:
        append_rows(cache, blocks)

    def drop_block(self, block: StoredBlock) -> None:
        """Nothing to do on one rank: the block's tensors go with its last reference."""

    def block_bytes(self, block: StoredBlock) -> int:
        return block.nbytes


class TargetModel(CacheOperations):
    """Stateless wrapper around one HF causal LM; every call names the caches it extends.

    ``forward`` runs the rows of any number of sequences in one forward pass: the embedding,
    every linear layer and the LM head run once over all rows, attention per sequence against
    its own cache (``grouped_attention.ragged_attention``). One sequence is the batch of one;
    there is no other path. ``block_tokens``: the size of the fixed blocks prompts are
    attended in (see the module's docstring). Raises UnsupportedModelError for a model it
    cannot run.
    """

    def __init__(self, model: PreTrainedModel, block_tokens: int = DEFAULT_BLOCK_TOKENS
                 ) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if not use_grouped_tree_attention(model):
            raise UnsupportedModelError(
                f"{type(model).__name__} runs {attention_implementation(model)!r} attention; "
                "ragged verification needs SDPA (load it with attn_implementation='sdpa')")
        if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
            raise UnsupportedModelError("models with sliding-window attention layers are not "
                                        "supported by the ragged forward")
        self.model = model
        self.block_tokens = block_tokens
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def prefill(self, cache: DynamicCache, token_ids: Sequence[int]) -> torch.Tensor:
        """Run prompt tokens ``token_ids`` after what ``cache`` holds; return the last
        position's logits ``[vocab]``.

        Mutates: ``cache`` grows by ``len(token_ids)``.
        """
        return self.forward([SequenceRows(cache, tuple(token_ids), prompt=True)])[0][-1]

    def forward_tree(self, cache: DynamicCache, pending: Sequence[int], tree: DraftTree
                     ) -> torch.Tensor:
        """Logits ``[len(tree) + 1, vocab]`` for the root and every draft node, in one forward.

        ``pending``: the tokens ``cache`` does not hold yet, the last of them the tree's root —
        one token after a verification step, the whole prompt when the first tree rides on the
        prefill. Mutates: ``cache`` grows by ``len(pending) + len(tree)`` rows (pending first,
        then the nodes in tree order); ``commit_path`` must follow to keep only the accepted ones.
        """
        return self.forward([SequenceRows(cache, tuple(pending), tree,
                                          prompt=len(pending) > 1)])[0]

    @torch.inference_mode()
    def forward(self, batch: Sequence[SequenceRows]) -> list[torch.Tensor | None]:
        """One forward over every sequence's rows; per sequence, logits ``[len(tree) + 1,
        vocab]`` (None where ``logits`` is False).

        Mutates: each sequence's cache grows by its rows (see ``forward_tree``)."""
        check_batch(batch)
        ids, positions, spans, keep = [], [], [], []
        start = 0
        for rows in batch:
            prefix = rows.cache.get_seq_length()
            lead = len(rows.pending) - 1
            ids.append(rows.tree.input_ids(rows.pending, self.device))
            positions.append(rows.tree.position_ids(prefix, self.device, lead=lead))
            spans.append(self._span(rows, start, prefix))
            if rows.logits:
                keep.extend(range(start + lead, start + rows.rows))
            start += rows.rows
        kept = keep or [start - 1]  # the LM head needs a row; its logits are dropped
        # No attention mask and no cache: the model builds none (all its rows are "new" and
        # causal, which SDPA needs no mask for); each sequence brings its own to attention.
        out = self.model(input_ids=torch.cat(ids, dim=1), position_ids=torch.cat(positions, dim=1),
                         attention_mask=None, use_cache=False,
                         logits_to_keep=torch.tensor(kept, device=self.device),
                         **{RAGGED_BATCH: RaggedBatch(tuple(spans))})
        logits = out.logits[0]
        if self.device.type == "cuda":  # kernels run asynchronously: the forward's time (and
            torch.cuda.synchronize(self.device)  # the step's) ends when its logits exist
        result: list[torch.Tensor | None] = []
        taken = 0
        for rows in batch:
            if rows.logits:
                count = len(rows.tree) + 1
                result.append(logits[taken: taken + count])
                taken += count
            else:
                result.append(None)
        return result

    def _span(self, rows: SequenceRows, start: int, prefix: int) -> SequenceSpan:
        """How attention sees one sequence's rows: prompt rows block by block, then the rest
        (a decoding step's token, a tree's root and nodes) under one mask — none for one plain
        token, which SDPA runs as it is."""
        lead = len(rows.pending) - 1
        if not rows.prompt and not lead:  # a decoding step: its root, and a tree below it
            mask = rows.tree.attention_mask(prefix, self.dtype, self.device) \
                if len(rows.tree) else None
            return SequenceSpan(start, rows.rows, rows.cache, mask)
        blocks = prompt_blocks(prefix, len(rows.pending), self.block_tokens, self.dtype,
                               self.device)
        mask = None
        if len(rows.tree):  # the nodes below the prompt's last token
            mask = rows.tree.attention_mask(prefix, self.dtype, self.device,
                                            lead=lead)[..., lead + 1:, :]
        return SequenceSpan(start, rows.rows, rows.cache, mask, blocks)


def prompt_blocks(prefix: int, rows: int, block_tokens: int, dtype: torch.dtype,
                  device: torch.device | str) -> tuple[PromptBlock, ...]:
    """Prompt rows at positions ``prefix .. prefix + rows`` cut at the fixed block boundaries
    (multiples of ``block_tokens``), each with the additive mask of a block attended alone:
    every key before it visible, causal inside it (none for a block at position 0, which SDPA
    runs causally)."""
    blocks = []
    position = prefix
    while position < prefix + rows:
        end = min(prefix + rows, (position // block_tokens + 1) * block_tokens)
        size = end - position
        mask = None
        if position:
            mask = torch.zeros(size, end, dtype=dtype)
            mask[:, position:] = torch.full((size, size), torch.finfo(dtype).min,
                                            dtype=dtype).triu(1)
            mask = mask.to(device)[None, None]
        blocks.append(PromptBlock(position - prefix, size, end - prefix, mask))
        position = end
    return tuple(blocks)


def check_batch(batch: Sequence[SequenceRows]) -> None:
    """Raise ValueError unless ``batch`` is a forward's rows: at least one sequence, each with
    at least one pending token."""
    if not batch or any(not rows.pending for rows in batch):
        raise ValueError("a forward needs at least one sequence, each with at least one "
                         "pending token (its tree's root)")


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
            layer.values[..., base_length : base_length + len(kept), :] = (
                layer.values[..., index, :])
    surplus = total - base_length - len(kept)
    if surplus > 0:
        cache.crop(-surplus)


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` rows of ``cache``. Mutates: every layer of ``cache``."""
    surplus = cache.get_seq_length() - length
    if surplus > 0:
        cache.crop(-surplus)


@torch.inference_mode()
def copy_rows(cache: DynamicCache, start: int, end: int) -> StoredBlock:
    """A copy of rows ``start..end`` of every layer of ``cache``."""
    if not 0 <= start < end <= cache.get_seq_length():
        raise ValueError(f"rows {start}..{end} are not in a cache of "
                         f"{cache.get_seq_length()} rows")
    return StoredBlock(tuple((layer.keys[..., start:end, :].clone(),
                              layer.values[..., start:end, :].clone())
                             for layer in cache.layers))


@torch.inference_mode()
def append_rows(cache: DynamicCache, blocks: Sequence[StoredBlock]) -> None:
    """Append the rows of ``blocks``, in order, to every layer of ``cache``. Mutates:
    ``cache``."""
    if not blocks:
        return
    for index in range(len(blocks[0].layers)):
        keys = torch.cat([block.layers[index][0] for block in blocks], dim=-2)
        values = torch.cat([block.layers[index][1] for block in blocks], dim=-2)
        cache.update(keys, values, index)
