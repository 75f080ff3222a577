"""The ``toolspec`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolspec.bench.cli import add_bench_commands, bench_usage_error
from toolspec.bench.cli_options import (
    add_format_option,
    add_library_options,
    add_model_options,
    add_prefill_option,
    format_named,
    open_library,
)
from toolspec.bench.datasets import DatasetFormatError
from toolspec.bench.growth import GrowthInputError
from toolspec.bench.methods import UnknownMethodError
from toolspec.library import LibraryError
from toolspec.model.packages import DEFAULT_MODEL, REGISTRY, ModelError

_SIM_BUDGET = 16  # draft nodes per step when neither a budget nor a cost curve is given


def _sim(args: argparse.Namespace) -> int:
    from toolspec.bench.datasets import load_dataset
    from toolspec.bench.methods import METHODS, MethodSetup, parse_methods, split_budget
    from toolspec.bench.sim import (
        format_report,
        recorded_targets,
        reference_targets,
        simulate,
        write_step_ends,
    )
    from toolspec.core.budget import CostCurveFileError, CostModel
    from toolspec.model.loading import freeze_loaded_objects
    from toolspec.model.packages import load_tokenizer
    from toolspec.registry import budget_for

    name, own_budget = split_budget(args.drafter)
    method = {"schema": "toolspec-schema"}.get(name, name)
    parse_methods(method)
    nodes_given = own_budget if own_budget is not None else args.budget
    tokenizer = load_tokenizer(args.model)
    items = load_dataset(args.data, args.limit, args.skip)
    call_format = format_named(args.format)
    targets = (recorded_targets(tokenizer, items, args.recorded, call_format=call_format)
               if args.recorded else reference_targets(tokenizer, items, call_format))
    try:
        cost = CostModel.load(args.cost_curve) if args.cost_curve else None
    except CostCurveFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if nodes_given is None and cost is None:
        nodes_given = _SIM_BUDGET
    budget = budget_for(cost, nodes_given)  # as engines are built: one constructor
    sized = "cost-aware budget" if nodes_given is None else f"budget {nodes_given}"
    if args.chains:
        return _sim_chains(args, method, tokenizer, targets)
    with open_library(args, [method]) as library:
        drafter = METHODS[method](MethodSetup(tokenizer, library))(())
        freeze_loaded_objects()  # as bench and serving do: drafting times without old objects' GC
        report = simulate(drafter, targets, budget, tokenizer, cost, library=library,
                          tenant=args.tenant, draft_at_prefill=args.draft_at_prefill)
    print(f"{method} on {args.data} ({'recorded outputs' if args.recorded else 'ground truth'}), "
          f"{sized}")
    print(format_report(report))
    if args.json:
        document = {"drafter": method, "data": str(args.data), **report.as_dict()}
        Path(args.json).write_text(json.dumps(document, indent=2))
    if args.step_ends:
        write_step_ends(Path(args.step_ends), report.step_ends, targets, tokenizer)
    return 0


def _sim_chains(args: argparse.Namespace, method: str, tokenizer: Any, targets: list[Any]
                ) -> int:
    """``toolspec sim --chains K``: the targets through the ToolSpec proposer as vLLM drives it,
    one chain of at most K tokens per step (``toolspec/bench/chains.py``)."""
    from toolspec.bench.chains import replay_chains
    from toolspec.vllm.sessions import SessionSettings

    settings = SessionSettings(max_tokens=args.chains, method=method,
                               min_reach=args.min_reach, tree_nodes=args.tree_nodes)
    with open_library(args, [method]) as library:
        report = replay_chains(tokenizer, targets, settings, library, args.tenant)
    print(f"{method} on {args.data} ({'recorded outputs' if args.recorded else 'ground truth'}), "
          f"chains of at most {args.chains} tokens (min_reach {args.min_reach}, trees of "
          f"{args.tree_nodes}x{args.chains} nodes)")
    print(json.dumps(report.as_dict(), indent=2))
    if args.json:
        document = {"drafter": method, "data": str(args.data), "chains": args.chains,
                    "min_reach": args.min_reach, "tree_nodes": args.tree_nodes,
                    **report.as_dict()}
        Path(args.json).write_text(json.dumps(document, indent=2))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from toolspec.bench.demo import run_demo

    return run_demo(args.model, args.dtype, args.items, args.prepack_linear, args.exact_bf16,
                    max_new_tokens=args.max_new_tokens)


def _models(args: argparse.Namespace) -> int:
    from toolspec.model.packages import converted_dir, locate_parts

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

    demo = commands.add_parser("demo", help="plain vs speculative decoding on a few API-Bank "
                                             "items, end to end")
    add_model_options(demo)
    demo.add_argument("--no-exact-bf16", dest="exact_bf16", action="store_false",
                      help="bf16 with the stock kernels (faster; outputs may differ from plain "
                           "decoding's at near-ties)")
    demo.set_defaults(exact_bf16=True)  # the demo shows identical outputs where the CPU can
    demo.add_argument("--items", type=int, default=3)
    demo.add_argument("--max-new-tokens", type=int, default=160,
                      help="tokens each method decodes per item at most")
    demo.set_defaults(handler=_demo)

    add_bench_commands(commands)

    sim = commands.add_parser("sim", help="replay known outputs through a drafter, no model")
    sim.add_argument("--data", required=True,
                     help="API-Bank JSON file, a .jsonl of OpenAI chat requests (reference_calls "
                          "replayed unless --recorded), bfcl:<category> or nestful:<split>")
    sim.add_argument("--limit", type=int, default=None)
    sim.add_argument("--skip", type=int, default=0, help="leave out the first N items")
    sim.add_argument("--drafter", default="schema", help="schema, pld, or any bench method")
    sim.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer to use")
    sim.add_argument("--budget", type=int, default=None,
                     help="draft nodes per step (default: sized to --cost-curve, else 16); with "
                          "--cost-curve, a fixed cap whose speed-up the curve estimates")
    sim.add_argument("--cost-curve", type=Path,
                     help="cost_curve.json, or a bench run's results.json (the curve its budget "
                          "used): size trees to it (unless --budget) and estimate the speed-up")
    sim.add_argument("--recorded", type=Path,
                     help="items.jsonl from toolspec bench: replay its ar outputs")
    sim.add_argument("--chains", type=int, default=None, metavar="K",
                     help="replay as vLLM's speculative decoding with the ToolSpec proposer: "
                          "one chain of at most K tokens per step instead of a tree")
    sim.add_argument("--min-reach", type=float, default=0.3,
                     help="with --chains: a chain stops before a less likely token")
    sim.add_argument("--tree-nodes", type=int, default=4,
                     help="with --chains: each chain is cut from a tree of this many x K nodes")
    sim.add_argument("--json", type=Path, help="write the report here")
    sim.add_argument("--step-ends", type=Path,
                     help="write every step that ended before the output here (JSON lines: "
                          "the missed token, its call state, the text before it, and whether "
                          "the drafter had proposed it)")
    add_format_option(sim)
    add_library_options(sim)
    add_prefill_option(sim)
    sim.set_defaults(handler=_sim)

    from toolspec.library.cli import add_library_commands

    add_library_commands(commands)

    models = commands.add_parser("models", help="list the registered models")
    models.add_argument("--prepare", choices=list(REGISTRY), help="convert this model now")
    models.set_defaults(handler=_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    usage_error = bench_usage_error(args)
    if usage_error:
        parser.error(usage_error)
    try:
        return args.handler(args)
    except (ModelError, DatasetFormatError, UnknownMethodError, LibraryError,
            GrowthInputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
