"""Where a verification forward rounds apart from plain one-row decoding steps.

Decodes a prompt's first tokens one row at a time (as ``ar`` does), then verifies those same
tokens as one draft chain (as speculative decoding does), and reports, per layer module, whether
the chain's first row is bitwise the one-row step's. Run it twice over: with the attention the
engine uses, and with every tree row attended in an SDPA call of its own over exactly the keys a
one-row step holds (``--row-by-row-attention``), which takes attention out of the picture and
leaves the matrix-product kernels. It also reports, per linear-layer shape, which row counts
round a row the same way.

    .venv/bin/python scripts/bf16_rounding.py --dtype bf16
    .venv/bin/python scripts/bf16_rounding.py --dtype bf16 --row-by-row-attention

A diagnostic, not part of the served system: it registers one extra attention function through
transformers' ``AttentionInterface`` (``register_ragged_attention``) for its own model instance.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from toolspec.bench.datasets import load_dataset
from toolspec.calls.prompts import chat_prompt
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.model.attention import (
    grouped_sdpa_attention,
    ragged_attention,
    register_ragged_attention,
)
from toolspec.model.loading import load_model
from toolspec.model.packages import DEFAULT_MODEL
from toolspec.model.target_model import TargetModel

ROW_BY_ROW = "toolspec_row_by_row_sdpa"
SAMPLE = "toolspec/bench/datasets/samples/apibank-level1-sample.json"


def row_by_row_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: torch.Tensor | None,
                         dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, toolspec_batch: Any = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Each masked row attended alone over the keys its mask row shows, in their order: the call
    a one-row decoding step makes. Unmasked forwards (prefill, one-row steps) run stock SDPA."""
    if toolspec_batch is not None:  # the engine's ragged forward: one sequence at a time
        return ragged_attention(module, query, key, value, toolspec_batch,
                                attend=row_by_row_attention, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)
    blocks = kwargs.pop("toolspec_prompt_blocks", ())
    if blocks:  # prompt rows as the engine attends them, block by block; the rest row by row
        first = blocks[-1].first + blocks[-1].rows
        seen = key.shape[2] - query.shape[2] + first
        prompt, _ = grouped_sdpa_attention(module, query[:, :, :first], key[:, :, :seen],
                                           value[:, :, :seen], None, dropout=dropout,
                                           scaling=scaling, is_causal=is_causal,
                                           toolspec_prompt_blocks=blocks, **kwargs)
        if first == query.shape[2]:
            return prompt, None
        rest, _ = row_by_row_attention(module, query[:, :, first:], key, value, attention_mask,
                                       dropout=dropout, scaling=scaling, is_causal=is_causal,
                                       **kwargs)
        return torch.cat((prompt, rest), dim=1), None
    if attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    visible = attention_mask[0, 0] == 0
    rows = []
    for row in range(query.shape[2]):
        keys = visible[row].nonzero().squeeze(1)
        contiguous = int(keys[-1]) == keys.numel() - 1
        row_key = key[:, :, : keys.numel()] if contiguous else key[:, :, keys]
        row_value = value[:, :, : keys.numel()] if contiguous else value[:, :, keys]
        output, _ = sdpa_attention_forward(module, query[:, :, row : row + 1], row_key, row_value,
                                           None, dropout=dropout, scaling=scaling,
                                           is_causal=False, **kwargs)
        rows.append(output)
    return torch.cat(rows, dim=1), None


def use_row_by_row_attention(model: PreTrainedModel) -> None:
    """Switch ``model`` to ``row_by_row_attention`` (registered under ``ROW_BY_ROW``, masks built
    as for stock SDPA). Mutates: ``model``'s attention implementation."""
    register_ragged_attention(ROW_BY_ROW, row_by_row_attention)
    model.set_attn_implementation(ROW_BY_ROW)


def capture_outputs(model: torch.nn.Module, layers: int) -> tuple[dict[str, torch.Tensor],
                                                                   Callable[[], None]]:
    """Forward hooks recording the output of every module in the first ``layers`` decoder layers
    (the latest call's, overwritten each forward); returns the records and a remover."""
    records: dict[str, torch.Tensor] = {}
    prefixes = tuple(f"model.layers.{index}." for index in range(layers))
    handles = []
    for name, module in model.named_modules():
        if name.startswith(prefixes):
            def record(_module: Any, _inputs: Any, output: Any, name: str = name) -> None:
                records[name] = (output[0] if isinstance(output, tuple)
                                 else output).detach().clone()
            handles.append(module.register_forward_hook(record))
    return records, lambda: [handle.remove() for handle in handles]


def linear_row_groups(weight: torch.Tensor, max_rows: int = 64, trials: int = 4
                      ) -> list[tuple[int, int]]:
    """Ranges of row counts (1..max_rows) over which ``x @ weight.T`` gives its first row
    bitwise the same result, for every one of ``trials`` random inputs: one range means the
    kernel rounds a row the same way whatever the row count. (Two kernels can round the same
    way on one input and apart on another, hence several.)"""
    generator = torch.Generator().manual_seed(0)
    same_as_previous = [True] * (max_rows + 1)
    for _ in range(trials):
        x = torch.randn(max_rows, weight.shape[1], generator=generator).to(weight.dtype)
        previous: torch.Tensor | None = None
        for rows in range(1, max_rows + 1):
            first = torch.nn.functional.linear(x[:rows], weight)[0]
            if previous is not None and not torch.equal(first, previous):
                same_as_previous[rows] = False
            previous = first
    groups: list[tuple[int, int]] = []
    for rows in range(1, max_rows + 1):
        if groups and same_as_previous[rows]:
            groups[-1] = (groups[-1][0], rows)
        else:
            groups.append((rows, rows))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--data", default=SAMPLE, help="the first item's prompt is used")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--layers", type=int, default=2, help="layers whose modules are compared")
    parser.add_argument("--row-by-row-attention", action="store_true")
    args = parser.parse_args()
    if args.tokens < 2:
        parser.error("--tokens must be at least 2 (a chain needs one drafted token)")

    loaded = load_model(args.model, args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    item = load_dataset(args.data, 1)[0]
    ids = chat_prompt(tokenizer, item.messages, item.openai_tools)[0]
    target = TargetModel(model)
    if args.row_by_row_attention:
        use_row_by_row_attention(model)
    records, remove_hooks = capture_outputs(model, args.layers)

    cache = target.new_cache()
    target.prefill(cache, ids[:-1])
    pending, tokens, step_logits = ids[-1], [], []
    first_step: dict[str, torch.Tensor] = {}
    for _ in range(args.tokens):
        logits = target.forward_tree(cache, [pending], DraftTree())[-1]
        if not first_step:
            first_step = dict(records)
        step_logits.append(logits)
        pending = int(logits.argmax())
        tokens.append(pending)

    chain = DraftTree(tuple(tokens[:-1]), (ROOT, *range(len(tokens) - 2)),
                      ("ar",) * (len(tokens) - 1))
    cache = target.new_cache()
    target.prefill(cache, ids[:-1])
    started = time.perf_counter()
    chain_logits = target.forward_tree(cache, [ids[-1]], chain)
    elapsed = time.perf_counter() - started
    remove_hooks()

    print(f"{args.model} {args.dtype}, prompt {len(ids)} tokens, attention "
          f"{model.config._attn_implementation}; chain of {len(chain)} in {elapsed * 1000:.0f} ms")
    print("first row of the chain forward vs the first one-row step, per module:")
    for name, one_row in first_step.items():
        row = records[name][:, :1] if records[name].dim() == 3 else records[name]
        if row.shape != one_row.shape:
            continue
        difference = float((row.float() - one_row.float()).abs().max())
        print(f"  {name:45s} "
              f"{'bitwise' if torch.equal(row, one_row) else f'differs {difference:.3g}'}")
    same = sum(torch.equal(chain_logits[k], step_logits[k]) for k in range(len(tokens)))
    worst = max(float((chain_logits[k].float() - step_logits[k].float()).abs().max())
                for k in range(len(tokens)))
    print(f"logits: {same} of {len(tokens)} rows bitwise; largest difference {worst:.3g}")
    layer = model.model.layers[0]
    weights = {"q_proj": layer.self_attn.q_proj.weight, "o_proj": layer.self_attn.o_proj.weight,
               "gate_proj": layer.mlp.gate_proj.weight, "down_proj": layer.mlp.down_proj.weight,
               "lm_head": model.lm_head.weight}
    print("row counts (1-64) over which a linear layer rounds its first row the same way:")
    for name, weight in weights.items():
        groups = linear_row_groups(weight.detach())
        print(f"  {name:10s} {weight.shape[1]}->{weight.shape[0]}: "
              + ", ".join(f"{a}-{b}" for a, b in groups))


if __name__ == "__main__":
    main()
