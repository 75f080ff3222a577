"""``toolspec demo``: the default model on a few API-Bank items, plain vs speculative decoding."""

from __future__ import annotations

import json

from toolspec.bench.methods import parse_methods
from toolspec.bench.run import build_engines, format_table, run_items, summarize
from toolspec.datasets import load_apibank, sample_path
from toolspec.engine import GenerationParams
from toolspec.models import dtype_name, load_model


def run_demo(model: str, dtype: str, count: int, prepack_linear: bool = True) -> int:
    print(f"loading {model} (the first run rebuilds and converts the weights, about a minute)...")
    loaded = load_model(model, dtype=dtype, prepack_linear=prepack_linear)
    items = load_apibank(sample_path(), limit=count)
    methods = parse_methods("ar,pld,toolspec-schema")
    results = list(run_items(build_engines(loaded, methods), loaded.tokenizer, items, methods,
                             GenerationParams(max_new_tokens=160), progress=False))
    by_item = {(r.item, r.method): r for r in results}
    for item in items:
        ar = by_item[item.id, "ar"]
        print(f"\n=== {item.id}")
        print(f"expected call  : {json.dumps(item.reference_calls[0])}")
        print(f"model output   : {ar.text.strip()}")
        for method in methods[1:]:
            spec = by_item[item.id, method]
            verdict = "identical to plain decoding" if spec.identical_to_ar else "DIFFERENT"
            speedup = (spec.decode_tokens / spec.decode_s) / (ar.decode_tokens / ar.decode_s)
            print(f"{method:<15}: {verdict}; {spec.decode_tokens / spec.steps:.2f} tokens per "
                  f"step, decode {speedup:.2f}x faster")
    print(f"\n{loaded.name} {dtype_name(loaded.dtype)}, {len(items)} items:")
    print(format_table(summarize(results, methods)))
    return 0
