"""Does serving a prompt from the prefix cache change the output? Cold vs cached, per item.

For each item of a data set: its output with a cold prefill (no prefix cache), then — with a
prefix cache that already holds the prompt from an earlier identical request — its output
with every block but the last taken from the cache, both by plain decoding (``ar``) or
ToolSpec with a fixed draft budget (``--method``), greedy. fp32 with prepacked linears is
bitwise by construction (tests); bf16's matrix kernels round a row by how many rows share its
call, so the recomputed last block can round apart and flip a near-tie: for each differing
output the script reports the top-two logit margin where the cold output first differs.
``--exact-bf16`` runs bf16 with row-independent kernels, which must stay identical.

    .venv/bin/python scripts/prefix_cache_exactness.py --data bfcl:multiple --limit 30 --dtype bf16

A diagnostic: prints a summary and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from toolspec.bench.datasets import load_dataset
from toolspec.bench.observers import MarginRecorder
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.core.engine import Engine, GenerationParams
from toolspec.core.prefix_cache import PrefixCache
from toolspec.model.loading import load_model
from toolspec.model.packages import DEFAULT_MODEL
from toolspec.model.target_model import TargetModel
from toolspec.registry import DrafterFactory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--exact-bf16", action="store_true")
    parser.add_argument("--data", default="bfcl:multiple")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--method", default="ar", choices=("ar", "toolspec-schema"))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    loaded = load_model(args.model, args.dtype, exact_bf16=args.exact_bf16)
    model = TargetModel(loaded.model)
    budget = 8 if args.method != "ar" else 0
    cold = Engine(model, loaded.tokenizer, budget=budget)
    cached = Engine(model, loaded.tokenizer, budget=budget,
                    prefix_cache=PrefixCache(model, 1 << 31, model.block_tokens))
    drafters = DrafterFactory(args.method, loaded.tokenizer) \
        if args.method != "ar" else None
    params = GenerationParams(max_new_tokens=args.max_tokens)
    rows: list[dict[str, Any]] = []
    for item in load_dataset(args.data, args.limit, skip=args.skip):
        prompt, call_format = chat_prompt(loaded.tokenizer, item.messages, item.openai_tools)

        def run(engine: Engine, tenant: str, margins: MarginRecorder | None = None) -> Any:
            drafter = drafters.for_request(tenant, item.tools is not None) if drafters else None
            return engine.generate(prompt, drafter, params, tools=item.tools,
                                   call_format=call_format,
                                   conversation=conversation_text(item.messages), tenant=tenant,
                                   observers=(margins,) if margins is not None else ())

        margins = MarginRecorder()
        reference = run(cold, "cold", margins)
        run(cached, item.id)  # fills the cache with this prompt's blocks
        served = run(cached, item.id)
        differs_at = next((i for i, (a, b) in enumerate(zip(reference.tokens, served.tokens))
                           if a != b), None)
        if differs_at is None and len(reference.tokens) != len(served.tokens):
            differs_at = min(len(reference.tokens), len(served.tokens))
        rows.append({"item": item.id, "prompt_tokens": len(prompt),
                     "cached_tokens": served.cached_tokens,
                     "identical": differs_at is None, "first_difference": differs_at,
                     "margin_there": None if differs_at is None
                     or differs_at >= len(margins.margins)
                     else round(margins.margins[differs_at], 4)})
        print(json.dumps(rows[-1]), flush=True)
    identical = sum(row["identical"] for row in rows)
    summary = {"model": loaded.name, "dtype": args.dtype, "exact_bf16": args.exact_bf16,
               "method": args.method, "data": args.data, "items": len(rows),
               "identical": identical, "identical_share": identical / len(rows) if rows else 0,
               "margins_where_different": sorted(row["margin_there"] for row in rows
                                                 if not row["identical"]
                                                 and row["margin_there"] is not None)}
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "items": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
