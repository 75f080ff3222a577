"""Tree attention that keeps grouped key/value heads on CPU.

Verifying a draft tree needs an explicit attention mask. With a mask, transformers' stock SDPA
path on CPU copies every key/value head once per query head that shares it (``repeat_kv``; 7
copies for the default model) before calling the kernel, and PyTorch's CPU kernel splits its
work per head and per block of query rows, which for the few rows of a decoding step or a draft
tree costs far more than the arithmetic. This module registers an attention function that lays
the query heads sharing a key/value head out as rows of that head instead (``_heads_as_rows``):
the same attention, no copies, 2-10x faster for few rows (in bf16 a one-row step's attention
at a 500-token context: 0.73 -> 0.06 ms a layer; a 16-session step 713 -> 438 ms,
``scripts/profile_step.py``). Prompts starting at position 0 keep the stock causal kernel.

It is registered through transformers' ``AttentionInterface`` (its documented extension point),
under its own name; models opt in with ``use_grouped_tree_attention``. Nothing is patched.

The same function attends a ragged batch (``RAGGED_BATCH``): the rows of several sequences in
one forward — draft trees, decoding steps, prompt chunks — each against its own cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, Cache, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "toolspec_grouped_sdpa"
STOCK_SDPA = "sdpa"
# Bumped whenever the kernels behind the attention functions change how they compute (the
# cached verification cost curves are keyed by it): 2 = query heads as rows of their KV head.
ATTENTION_REVISION = 2


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    toolspec_batch: RaggedBatch | None = None,
    toolspec_prompt_blocks: tuple[PromptBlock, ...] = (),
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Stock SDPA attention, except that a masked forward over grouped heads on CPU runs on the
    key/value heads as they are. Shapes as transformers' attention functions: ``query``
    ``[batch, heads, q, dim]``, ``key``/``value`` ``[batch, kv_heads, kv, dim]``; returns
    ``[batch, q, heads, dim]``.

    ``toolspec_prompt_blocks``: the first rows are prompt rows, attended block by block (see
    ``PromptBlock``); the rows after them (a tree's nodes) in one more call under
    ``attention_mask``, which covers only them. ``toolspec_batch``: the rows belong to several
    sequences (``ragged_attention``)."""
    if toolspec_batch is not None:
        return ragged_attention(module, query, key, value, toolspec_batch, dropout=dropout,
                                scaling=scaling, is_causal=is_causal, **kwargs)
    if toolspec_prompt_blocks:
        outputs = _attend_prompt_blocks(module, query, key, value, toolspec_prompt_blocks,
                                        dropout=dropout, scaling=scaling, is_causal=is_causal,
                                        **kwargs)
        first = _rows_after(toolspec_prompt_blocks)
        if first < query.shape[2]:
            rest, _ = grouped_sdpa_attention(module, query[:, :, first:], key, value,
                                             attention_mask, dropout=dropout, scaling=scaling,
                                             is_causal=is_causal, **kwargs)
            outputs.append(rest)
        return _joined(outputs), None
    groups = getattr(module, "num_key_value_groups", 1)
    rows = query.shape[2]
    if ((attention_mask is None and rows > 1) or groups == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return _heads_as_rows(query, key, value, attention_mask, groups, dropout, scaling), None


def _heads_as_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   mask: torch.Tensor | None, groups: int, dropout: float,
                   scaling: float | None) -> torch.Tensor:
    """SDPA with the ``groups`` query heads that share a key/value head laid out as rows of one
    head: ``[1, kv_heads, groups * q, dim]`` against ``[1, kv_heads, kv, dim]``, each row
    under its own mask row. The same attention; on CPU with few query rows (decoding steps,
    draft trees) PyTorch's kernel runs it 2-10x faster than the heads side by side, whose
    work it splits per head and per block of rows (``scripts/profile_step.py``: attention
    kernels were 39 % of a 16-session bf16 step). Returns ``[1, q, heads, dim]``."""
    batch, heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, groups * rows, dim)  # head h: kv head h // groups
    if mask is not None:
        mask = mask.expand(batch, -1, rows, -1).repeat(1, 1, groups, 1)
    output = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return output.reshape(batch, heads, rows, dim).transpose(1, 2).contiguous()


def _attend_prompt_blocks(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                          value: torch.Tensor, blocks: tuple[PromptBlock, ...], **kwargs: Any
                          ) -> list[torch.Tensor]:
    """Each prompt block attended in a call of its own (``grouped_sdpa_attention`` without a
    batch): its rows against the keys up to its end, under its own mask."""
    outputs = []
    for block in blocks:
        output, _ = grouped_sdpa_attention(
            module, query[:, :, block.first: block.first + block.rows],
            key[:, :, : key.shape[2] - query.shape[2] + block.seen],
            value[:, :, : value.shape[2] - query.shape[2] + block.seen], block.mask, **kwargs)
        outputs.append(output)
    return outputs


def _rows_after(blocks: tuple[PromptBlock, ...]) -> int:
    return blocks[-1].first + blocks[-1].rows


def _joined(outputs: list[torch.Tensor]) -> torch.Tensor:
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


@dataclass(frozen=True)
class PromptBlock:
    """Prompt rows ``first .. first + rows`` of a sequence's rows in a forward, lying inside
    one fixed block of positions: attended in a call of their own against the keys a forward
    ending at the block's last row holds — ``seen`` of the sequence's rows (the cache's rows
    before the forward come on top) — under ``mask`` (None: causal from position 0). Why:
    SDPA rounds a row by the shape of its call, so a prompt attended block by block gets the
    same keys and values however it is chunked across forwards and however many of its blocks
    a prefix cache supplied (``toolspec.model.target_model``)."""

    first: int
    rows: int
    seen: int
    mask: torch.Tensor | None


# Model keyword argument carrying a ``RaggedBatch``: the forward's rows belong to several
# sequences, each with its own cache and mask (see ``ragged_attention``).
RAGGED_BATCH = "toolspec_batch"


@dataclass(frozen=True)
class SequenceSpan:
    """One sequence's rows in a ragged forward: ``rows`` rows from ``start``, attended against
    ``cache`` (which takes their keys and values). ``prompt_blocks``: its leading prompt rows,
    block by block; ``mask``: the rows after them (None: causal, as a plain forward of those
    rows alone)."""

    start: int
    rows: int
    cache: Cache
    mask: torch.Tensor | None
    prompt_blocks: tuple[PromptBlock, ...] = ()


@dataclass(frozen=True)
class RaggedBatch:
    """The sequences of one forward, in row order."""

    spans: tuple[SequenceSpan, ...]


def ragged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, batch: RaggedBatch,
                     attend: AttentionFunction | None = None, **kwargs: Any
                     ) -> tuple[torch.Tensor, None]:
    """Attention over a ragged batch: every linear layer ran once on all rows; here each
    sequence's rows join its own cache and are attended in a call of their own, with the shapes
    and mask the sequence would have alone — so, wherever the linear layers are
    row-independent (prepacked fp32), a sequence's logits are bitwise those of a forward of it
    alone. ``attend``: the attention of one sequence (default ``grouped_sdpa_attention``).
    Mutates: every span's cache (this layer's keys and values grow by its rows)."""
    attend = attend or grouped_sdpa_attention
    outputs = []
    for span in batch.spans:
        rows = slice(span.start, span.start + span.rows)
        keys, values = span.cache.update(key[:, :, rows], value[:, :, rows], module.layer_idx)
        output, _ = attend(module, query[:, :, rows], keys, values, span.mask,
                           toolspec_prompt_blocks=span.prompt_blocks, **kwargs)
        outputs.append(output)
    return torch.cat(outputs, dim=1), None


AttentionFunction = Callable[..., tuple[torch.Tensor, None]]
# Attention functions that attend a ``RAGGED_BATCH`` (the only ones ``TargetModel`` runs).
_RAGGED_CAPABLE: set[str] = set()


def register_ragged_attention(name: str, function: AttentionFunction) -> None:
    """Register ``function`` with transformers under ``name`` (masks built as for stock SDPA)
    as one that attends a ragged batch (it must hand ``toolspec_batch`` to
    ``ragged_attention``). Mutates: transformers' attention registries."""
    AttentionInterface.register(name, function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    _RAGGED_CAPABLE.add(name)


register_ragged_attention(GROUPED_SDPA, grouped_sdpa_attention)

EXACT_ROWS = "toolspec_exact_rows"


def exact_rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    toolspec_batch: RaggedBatch | None = None,
    toolspec_prompt_blocks: tuple[PromptBlock, ...] = (),
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention whose result for a generated token's row does not depend on the forward it
    is in (exact bf16). Prompt rows are attended block by block, exactly as
    ``grouped_sdpa_attention`` (and so plain decoding's prefill) does. Every other row — a
    decoding step's token, a draft tree's root and nodes — is attended on its own: the keys it
    sees gathered in position order (for a tree node: the prefix, then its ancestors — the
    keys a one-row step at its position holds, bitwise, where the linear layers are
    row-independent), and ``softmax(q·Kᵀ·scale)·V`` computed in fp32 with the same shapes as
    that step's. SDPA's kernels block rows and keys by the call's shape, so a row among others
    would round apart. Costs a Python loop over those rows per layer."""
    if toolspec_batch is not None:
        return ragged_attention(module, query, key, value, toolspec_batch,
                                attend=exact_rows_attention, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)
    outputs = []
    first = 0
    if toolspec_prompt_blocks:
        outputs = _attend_prompt_blocks(module, query, key, value, toolspec_prompt_blocks,
                                        dropout=dropout, scaling=scaling, is_causal=is_causal,
                                        **kwargs)
        first = _rows_after(toolspec_prompt_blocks)
    if first < query.shape[2]:
        outputs.append(_row_by_row(query[:, :, first:], key, value, attention_mask,
                                   scaling if scaling is not None else query.shape[-1] ** -0.5))
    return _joined(outputs), None


def _row_by_row(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The rows of ``query`` ``[1, heads, rows, dim]`` attended one at a time against the keys
    their ``mask`` row shows (None: all); returns ``[1, rows, heads, dim]``."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads = key.shape[1]
    keys, values = key[0].float(), value[0].float()  # [kv_heads, seen, dim], contiguous
    grouped = query[0].float().transpose(0, 1).reshape(-1, kv_heads, heads // kv_heads, dim)
    visible = None if mask is None else (mask[0, 0] == 0)
    outputs = []
    for row in range(len(grouped)):
        if visible is None:
            row_keys, row_values = keys, values
        else:  # the keys this row sees, in position order: as contiguous as a step's cache
            shown = visible[row].nonzero().squeeze(1)
            row_keys, row_values = keys.index_select(1, shown), values.index_select(1, shown)
        scores = torch.bmm(grouped[row], row_keys.transpose(1, 2)).mul_(scale)
        outputs.append(torch.bmm(torch.softmax(scores, dim=-1), row_values))
    return torch.stack(outputs).reshape(1, len(outputs), heads, dim).to(query.dtype)


register_ragged_attention(EXACT_ROWS, exact_rows_attention)


def attention_implementation(model: PreTrainedModel) -> str:
    """The name of the attention function ``model`` runs (``sdpa``, ``GROUPED_SDPA``, ...)."""
    return str(model.config._attn_implementation)


def use_grouped_tree_attention(model: PreTrainedModel) -> bool:
    """Switch ``model`` from stock SDPA to ``grouped_sdpa_attention``; True when it then runs
    an attention function that attends ragged batches (that one, or another registered with
    ``register_ragged_attention``), False (and no change) otherwise. Mutates: ``model``'s
    attention implementation."""
    current = attention_implementation(model)
    if current in _RAGGED_CAPABLE:
        return True
    if current != STOCK_SDPA:
        return False
    model.set_attn_implementation(GROUPED_SDPA)
    return True
