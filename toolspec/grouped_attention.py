"""Tree attention that keeps grouped key/value heads on CPU.

Verifying a draft tree needs an explicit attention mask. With a mask, transformers' stock SDPA
path on CPU copies every key/value head once per query head that shares it (``repeat_kv``; 7
copies for the default model) before calling the kernel. At a 1,500-token context that copy and
the wider kernel cost about 75 ms per 16-row forward, more than the draft rows themselves
(``toolspec bench cost-curve`` measures it). PyTorch's CPU SDPA kernel takes grouped heads and a
mask directly (``enable_gqa``), with bitwise the same result, so this module registers an
attention function that does just that and otherwise defers to the stock one.

It is registered through transformers' ``AttentionInterface`` (its documented extension point),
under its own name; models opt in with ``use_grouped_tree_attention``. Nothing is patched.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "toolspec_grouped_sdpa"
STOCK_SDPA = "sdpa"
# Model keyword argument (passed through to attention functions) naming how many leading rows
# of a forward are plain causal tokens. Why: SDPA's result for a row depends on the shape of the
# call it is in (kernel blocking), so a prompt prefilled together with a draft tree would get
# keys and values a few bf16 ulps away from a plain prefill's, and a near-tie later in the
# output could then go the other way. Attending those rows in a call of their own keeps the
# prompt's cache bitwise equal to plain decoding's.
CAUSAL_ROWS = "toolspec_causal_rows"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    toolspec_causal_rows: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Stock SDPA attention, except that a masked forward over grouped heads on CPU runs on the
    key/value heads as they are. Shapes as transformers' attention functions: ``query``
    ``[batch, heads, q, dim]``, ``key``/``value`` ``[batch, kv_heads, kv, dim]``; returns
    ``[batch, q, heads, dim]``.

    ``toolspec_causal_rows``: the forward's first rows are plain causal tokens (a prompt ahead
    of a draft tree); they are attended exactly as a forward of those tokens alone would (see
    ``CAUSAL_ROWS``), the tree rows after them in a second call."""
    rows = query.shape[2]
    if toolspec_causal_rows is not None and attention_mask is not None \
            and 0 < toolspec_causal_rows < rows:
        causal = toolspec_causal_rows
        seen = key.shape[2] - rows + causal  # the keys a forward of the causal rows alone holds
        # With nothing cached the plain forward ran unmasked (is_causal): so must these rows.
        lead_mask = None if seen == causal else attention_mask[..., :causal, :seen]
        lead, _ = grouped_sdpa_attention(
            module, query[:, :, :causal], key[:, :, :seen], value[:, :, :seen], lead_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
        tree, _ = grouped_sdpa_attention(
            module, query[:, :, causal:], key, value, attention_mask[..., causal:, :],
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
        return torch.cat((lead, tree), dim=1), None
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups == 1 or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
# Masks are built exactly as for stock SDPA (the attention function above only reads them).
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def attention_implementation(model: PreTrainedModel) -> str:
    """The name of the attention function ``model`` runs (``sdpa``, ``GROUPED_SDPA``, ...)."""
    return str(model.config._attn_implementation)


def use_grouped_tree_attention(model: PreTrainedModel) -> bool:
    """Switch ``model`` from stock SDPA to ``grouped_sdpa_attention``; False (and no change) when
    it uses another attention implementation. Mutates: ``model``'s attention implementation."""
    if attention_implementation(model) not in (STOCK_SDPA, GROUPED_SDPA):
        return False
    model.set_attn_implementation(GROUPED_SDPA)
    return True
