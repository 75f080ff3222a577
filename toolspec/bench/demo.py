"""``toolspec demo``: the default model on a few API-Bank items, plain decoding beside speculative
decoding, end to end.

Each item is decoded by plain decoding (``ar``), prompt lookup (``pld``) and ToolSpec
(``toolspec``: schema-aware drafts and drafts retrieved from a call library that starts empty and
learns the calls plain decoding made on earlier items, as a served replica learns). What is
shown is what a user waits for: the whole request's time, prompt included, and whether the
output is the plain model's.

Identical outputs: fp32 always; bf16 where the CPU runs exact bf16 (``load_model``'s
``exact_bf16``, on by default here). Elsewhere bf16 rounds a row's logits by the shape of the
forward it is in, so where the model's top two tokens are within that rounding of each other
(a near-tie) the speculative output can take the other one; the demo then says so, with the
margin.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence

import torch

from toolspec.bench.datasets import BenchItem, load_apibank, sample_path
from toolspec.bench.methods import parse_methods
from toolspec.bench.run import ItemResult, build_engines, format_table, run_items, summarize
from toolspec.core.engine import GenerationParams
from toolspec.library import CallLibrary
from toolspec.model.loading import dtype_name, load_model

DEMO_METHODS = "ar,pld,toolspec"


def end_to_end_s(result: ItemResult) -> float:
    """The request's whole time: its prompt's forward and every step after it."""
    return result.prefill_s + result.decode_s


def verdict(result: ItemResult, exact: bool) -> str:
    """Whether ``result`` is plain decoding's output, and if not, why that can happen here."""
    if result.identical_to_ar:
        return "identical to plain decoding"
    margin = (f", where plain decoding's top two logits were {result.ar_margin:.3f} apart"
              if result.ar_margin is not None else "")
    if exact:
        return (f"DIFFERS from plain decoding at token {result.first_difference}{margin}: this "
                f"should not happen with exact arithmetic; please report it")
    return (f"differs from plain decoding at token {result.first_difference}{margin}: a "
            f"near-tie, which this dtype rounds by how many rows share a forward (fp32, or bf16 "
            f"on a CPU with exact bf16, gives identical outputs)")


def format_item(item: BenchItem, results: Mapping[str, ItemResult], exact: bool) -> str:
    """One item's lines: the expected call, plain decoding's output, then per method its
    verdict, forwards and end-to-end speed-up over plain decoding. Never divides by a step
    count: an output can arrive whole in the prompt's forward."""
    ar = results["ar"]
    expected = json.dumps(item.reference_calls[0]) if item.reference_calls else "–"
    lines = [f"=== {item.id}",
             f"expected call : {expected}",
             f"plain decoding: {ar.text.strip()}",
             f"{'ar':<14}: {ar.new_tokens} tokens in {ar.steps + 1} forwards, "
             f"{end_to_end_s(ar):.2f} s"]
    for method, result in results.items():
        if method == "ar":
            continue
        speedup = end_to_end_s(ar) / max(end_to_end_s(result), 1e-9)
        lines.append(f"{method:<14}: {result.new_tokens} tokens in {result.steps + 1} forwards, "
                     f"{end_to_end_s(result):.2f} s, {speedup:.2f}x end to end; "
                     f"{verdict(result, exact)}")
    return "\n".join(lines)


def run_demo(model: str, dtype: str, count: int, prepack_linear: bool = True,
             exact_bf16: bool = True, methods: str = DEMO_METHODS,
             items: Sequence[BenchItem] | None = None, max_new_tokens: int = 160) -> int:
    """Load ``model``, decode ``count`` sample items with every method (at most
    ``max_new_tokens`` each), print each item and the summary table. Returns the exit status
    (0)."""
    print(f"loading {model} (the first run rebuilds and converts the weights, about a minute)...")
    loaded = load_model(model, dtype=dtype, prepack_linear=prepack_linear, exact_bf16=exact_bf16)
    exact = loaded.dtype == torch.float32 or loaded.exact_bf16
    items = list(items) if items is not None else load_apibank(sample_path(), limit=count)
    chosen = parse_methods(methods)
    if loaded.exact_bf16:
        arithmetic = "exact bf16: outputs are bitwise plain decoding's"
    elif exact:
        arithmetic = "outputs are bitwise plain decoding's"
    else:
        arithmetic = "outputs may differ from plain decoding's at near-ties"
    print(f"{loaded.name} {dtype_name(loaded.dtype)} ({arithmetic}); {len(items)} items; "
          f"methods {', '.join(chosen)}")
    with tempfile.TemporaryDirectory(prefix="toolspec-demo-library-") as scratch, \
            CallLibrary(scratch) as library:
        results = list(run_items(build_engines(loaded, chosen), loaded.tokenizer, items, chosen,
                                 GenerationParams(max_new_tokens=max_new_tokens), progress=False,
                                 library=library))
    by_item: dict[str, dict[str, ItemResult]] = {}
    for result in results:
        by_item.setdefault(result.item, {})[result.method] = result
    for item in items:
        print()
        print(format_item(item, by_item[item.id], exact))
    print(f"\n{loaded.name} {dtype_name(loaded.dtype)}, {len(items)} items (e2e x: plain "
          f"decoding's time over the method's, prompt included):")
    print(format_table(summarize(results, chosen)))
    return 0
