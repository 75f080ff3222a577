"""The ``toolspec`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from toolspec.bench.methods import UnknownMethodError
from toolspec.datasets import DatasetFormatError
from toolspec.models import DEFAULT_MODEL, REGISTRY, ModelError


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"registered name ({', '.join(REGISTRY)}), a local HF directory or a "
                             f"hub id (default: {DEFAULT_MODEL})")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16 where the hardware runs it fast, else fp32")


def _bench(args: argparse.Namespace) -> int:
    from toolspec.bench.methods import parse_methods
    from toolspec.bench.run import (build_engine, format_table, results_document, run_items,
                                    summarize, write_outputs)
    from toolspec.datasets import load_apibank
    from toolspec.engine import GenerationParams
    from toolspec.models import load_model

    methods = parse_methods(args.methods)
    items = load_apibank(args.data, args.limit)
    if not items:
        print(f"{args.data}: no items", file=sys.stderr)
        return 2
    loaded = load_model(args.model, dtype=args.dtype)
    engine = build_engine(loaded, args.budget)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    results = list(run_items(engine, loaded.tokenizer, items, methods, params))
    summary = summarize(results, methods)
    document = results_document(loaded, len(items), summary, {
        "data": str(args.data), "draft_budget": args.budget, "max_new_tokens": args.max_new_tokens,
    })
    print(f"{loaded.name} {document['dtype']}, {len(items)} items of {args.data}, "
          f"draft budget {args.budget}\n{document['machine']}")
    print(format_table(summary))
    for method, entry in summary.items():
        for divergence in entry["divergences"]:
            print(f"  {method}: {divergence['item']} differs from ar at token "
                  f"{divergence['position']} (ar top-1/top-2 logit margin {divergence['ar_margin']})")
    if args.out:
        write_outputs(Path(args.out), document, results)
        print(f"wrote {args.out}/results.json and {args.out}/items.jsonl")
    return 0


def _cost_curve(args: argparse.Namespace) -> int:
    from toolspec.bench.cost_curve import format_cost_curve, measure_cost_curve
    from toolspec.bench.machine import describe_machine
    from toolspec.models import dtype_name, load_model
    from toolspec.target_model import TargetModel

    loaded = load_model(args.model, dtype=args.dtype)
    sizes = [2 ** i for i in range(args.max_k.bit_length()) if 2 ** i <= args.max_k]
    timings = measure_cost_curve(TargetModel(loaded.model), args.prefix, sizes, args.repeats)
    print(f"{loaded.name} {dtype_name(loaded.dtype)}, {args.prefix}-token prefix\n"
          f"{describe_machine(loaded.device)}")
    print(format_cost_curve(timings))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cost_curve.json").write_text(json.dumps({
            "model": loaded.name, "dtype": dtype_name(loaded.dtype), "prefix": args.prefix,
            "machine": describe_machine(loaded.device),
            "seconds": {str(k): t for k, t in timings.items()},
            "relative": {str(k): t / timings[sizes[0]] for k, t in timings.items()},
        }, indent=2))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from toolspec.demo import run_demo

    return run_demo(args.model, args.dtype, args.items)


def _models(args: argparse.Namespace) -> int:
    from toolspec.models import converted_dir, locate_parts

    for name, spec in REGISTRY.items():
        try:
            locate_parts(spec)
            state = "installed"
        except ModelError:
            state = f"not installed ({spec.install_hint()})"
        if args.prepare and args.prepare == name:
            state = f"converted at {converted_dir(spec)}"
        print(f"{name:<22}{state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolspec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="AR vs speculative decoding on a few API-Bank items")
    _add_model_options(demo)
    demo.add_argument("--items", type=int, default=3)
    demo.set_defaults(handler=_demo)

    bench = commands.add_parser("bench", help="benchmark decoding methods against plain decoding")
    _add_model_options(bench)
    bench.add_argument("--data", type=Path, help="a JSON file in the API-Bank processed format")
    bench.add_argument("--limit", type=int, default=None, help="first N items")
    bench.add_argument("--methods", default="ar,pld,oracle", help="comma-separated; ar always runs")
    bench.add_argument("--budget", type=int, default=8, help="draft nodes verified per step")
    bench.add_argument("--max-new-tokens", type=int, default=192)
    bench.add_argument("--out", type=Path, help="write results.json and items.jsonl here")
    bench.set_defaults(handler=_bench)
    bench_commands = bench.add_subparsers(dest="bench_command")
    cost = bench_commands.add_parser("cost-curve", help="forward cost of k tokens vs one token")
    _add_model_options(cost)
    cost.add_argument("--prefix", type=int, default=300, help="cached prefix length")
    cost.add_argument("--max-k", type=int, default=128)
    cost.add_argument("--repeats", type=int, default=5)
    cost.add_argument("--out", type=Path)
    cost.set_defaults(handler=_cost_curve)

    models = commands.add_parser("models", help="list the registered models")
    models.add_argument("--prepare", choices=list(REGISTRY), help="convert this model now")
    models.set_defaults(handler=_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler is _bench and args.data is None:
        parser.error("bench needs --data PATH (or the cost-curve subcommand)")
    try:
        return args.handler(args)
    except (ModelError, DatasetFormatError, UnknownMethodError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
