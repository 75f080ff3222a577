"""The ``toolspec`` command line."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolspec.bench.growth import GrowthInputError
from toolspec.bench.methods import UnknownMethodError
from toolspec.datasets import DatasetFormatError
from toolspec.library import LibraryError
from toolspec.models import DEFAULT_MODEL, REGISTRY, ModelError


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"registered name ({', '.join(REGISTRY)}), a local HF directory or a "
                             f"hub id (default: {DEFAULT_MODEL})")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16 where the hardware runs it fast, else fp32")
    parser.add_argument("--prepack-linear", action=argparse.BooleanOptionalAction, default=True,
                        help="fp32 on CPU: linear weights prepacked for oneDNN at load, which "
                             "makes plain steps faster and verification forwards cheap "
                             "(default; --no-prepack-linear: PyTorch's stock kernels)")


def _bench(args: argparse.Namespace) -> int:
    from toolspec.bench.methods import parse_methods
    from toolspec.bench.run import (ResultLog, build_engines, format_table, load_finished,
                                    results_document, run_items, summarize, write_summary)
    from toolspec.cost_curve import cached_cost_model
    from toolspec.datasets import load_dataset
    from toolspec.engine import GenerationParams
    from toolspec.models import freeze_loaded_objects, load_model

    methods = parse_methods(args.methods)
    items = load_dataset(args.data, args.limit)
    if not items:
        print(f"{args.data}: no items", file=sys.stderr)
        return 2
    loaded = load_model(args.model, dtype=args.dtype, prepack_linear=args.prepack_linear)
    cost = None if args.budget is not None else cached_cost_model(
        loaded, refresh=args.refresh_cost_curve)
    engines = build_engines(loaded, methods, args.budget, args.draft_at_prefill, cost)
    freeze_loaded_objects()
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    finished = load_finished(args.out / "items.jsonl", methods) if args.out else {}
    if finished:
        print(f"resuming: {len(finished)} items already done in {args.out}/items.jsonl")
    log = ResultLog(args.out / "items.jsonl", finished) if args.out else None
    with _library(args, methods) as library:
        seeded = library.stats().calls if library is not None else None
        results = [log.record(r) if log else r for r in run_items(
            engines, loaded.tokenizer, items, methods, params, call_format=_call_format(args.format),
            library=library, tenant=args.tenant, finished=finished)]
    if log:
        log.close()
    summary = summarize(results, methods)
    document = results_document(loaded, len(items), summary, {
        "data": str(args.data), "draft_budget": args.budget or "auto",
        "max_new_tokens": args.max_new_tokens,
        # What the budget sized trees to: a replay of this run needs the same curve.
        "cost_curve": None if cost is None else dict(zip(map(str, cost.sizes), cost.relative)),
        "library": {"seeded_calls": seeded, "seed": str(args.seed_library)} if seeded is not None
        else None,
        "acceptance_by_source": {method: rates for method, engine in engines.items()
                                 if (rates := engine.budget.calibration.rates())},
    })
    print(f"{loaded.name} {document['dtype']}, {len(items)} items of {args.data}, "
          f"draft budget {args.budget or 'auto'}\n{document['machine']}")
    print(format_table(summary))
    for method, entry in summary.items():
        for divergence in entry["divergences"]:
            print(f"  {method}: {divergence['item']} differs from ar at token "
                  f"{divergence['position']} (ar top-1/top-2 logit margin {divergence['ar_margin']})")
    if args.out:
        write_summary(args.out, document)
        print(f"wrote {args.out}/results.json and {args.out}/items.jsonl")
    if args.plot:
        from toolspec.bench.analysis import Run
        from toolspec.bench.report import plot_runs

        run = Run(args.out.name, document, tuple(results))
        for path in plot_runs([run], args.out):
            print(f"wrote {path}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from toolspec.bench.analysis import RunReadError, read_run
    from toolspec.bench.report import plot_runs

    try:
        runs = [read_run(directory) for directory in args.runs]
    except RunReadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.rescore:
        runs = [_rescored(run, args.model) for run in runs]
    for path in plot_runs(runs, args.out, prefix=args.prefix):
        print(f"wrote {path}")
    return 0


def _rescored(run: Any, model: str) -> Any:
    """``run`` with call accuracy / format adherence filled in where it predates them."""
    from toolspec.bench.report import rescored
    from toolspec.datasets import load_dataset
    from toolspec.models import load_tokenizer

    data = str(run.document.get("data"))
    try:
        items = load_dataset(data, run.document.get("items"))
    except DatasetFormatError as error:
        print(f"warning: {run.name}: not rescored ({error})", file=sys.stderr)
        return run
    return rescored(run, items, load_tokenizer(run.document.get("model") or model))


def _report(args: argparse.Namespace) -> int:
    from toolspec.bench.analysis import RunReadError, read_run
    from toolspec.bench.report import ReportConfigError, load_config, write_report

    try:
        config = load_config(args.config).limited(args.limit)
    except ReportConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.no_run:
        for dataset in config.datasets:
            print(f"== {dataset.name}: {dataset.data}, {dataset.limit or 'all'} items")
            # Parsed like a typed command, so every other option takes its bench default.
            argv = ["bench", "--model", config.model, "--dtype", config.dtype,
                    "--data", dataset.data, "--methods", config.methods,
                    "--budget", config.budget, "--max-new-tokens", str(config.max_new_tokens),
                    "--prepack-linear" if config.prepack_linear else "--no-prepack-linear",
                    "--out", str(config.out / dataset.name)]
            if dataset.limit is not None:
                argv += ["--limit", str(dataset.limit)]
            code = _bench(build_parser().parse_args(argv))
            if code:
                return code
    try:
        runs = [read_run(config.out / d.name, d.name) for d in config.datasets]
    except RunReadError as error:
        print(f"error: {error} (run the report without --no-run first)", file=sys.stderr)
        return 2
    if args.rescore:
        runs = [_rescored(run, config.model) for run in runs]
    command = " ".join(["toolspec", *sys.argv[1:]]) if args.command_line is None \
        else args.command_line
    page, images = write_report(runs, config.docs, command)
    for path in (page, *images):
        print(f"wrote {path}")
    return 0


def _cost_curve(args: argparse.Namespace) -> int:
    from toolspec.bench.machine import describe_machine
    from toolspec.cost_curve import (DEFAULT_SIZES, cost_curve_document, format_cost_curve,
                                     measure_cost_curve)
    from toolspec.models import dtype_name, load_model
    from toolspec.target_model import TargetModel

    loaded = load_model(args.model, dtype=args.dtype, prepack_linear=args.prepack_linear)
    sizes = [k for k in DEFAULT_SIZES if k <= args.max_k]
    timings = measure_cost_curve(TargetModel(loaded.model), args.prefix, sizes, args.repeats)
    print(f"{loaded.name} {dtype_name(loaded.dtype)}, {args.prefix}-token prefix\n"
          f"{describe_machine(loaded.device)}")
    print(format_cost_curve(timings))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        document = cost_curve_document(loaded, args.prefix, timings)
        (Path(args.out) / "cost_curve.json").write_text(json.dumps(document, indent=2))
    if args.plot:
        from toolspec.bench.plots import plot_cost_curves

        curves = [cost_curve_document(loaded, args.prefix, timings)]
        curves += [json.loads(Path(extra).read_text()) for extra in args.compare]
        plot_cost_curves(curves, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


_SIM_BUDGET = 16  # draft nodes per step when neither a budget nor a cost curve is given


def _sim(args: argparse.Namespace) -> int:
    from toolspec.bench.methods import METHODS, MethodSetup, parse_methods, split_budget
    from toolspec.budget import (CostAwareBudget, CostCurveFileError, CostModel, DraftBudget,
                                 FixedBudget)
    from toolspec.datasets import load_dataset
    from toolspec.models import freeze_loaded_objects, load_tokenizer
    from toolspec.sim import (format_report, recorded_targets, reference_targets, simulate,
                              write_step_ends)

    name, own_budget = split_budget(args.drafter)
    method = {"schema": "toolspec-schema"}.get(name, name)
    parse_methods(method)
    nodes_given = own_budget if own_budget is not None else args.budget
    tokenizer = load_tokenizer(args.model)
    items = load_dataset(args.data, args.limit)
    call_format = _call_format(args.format)
    targets = (recorded_targets(tokenizer, items, args.recorded, call_format=call_format)
               if args.recorded else reference_targets(tokenizer, items, call_format))
    try:
        cost = CostModel.load(args.cost_curve) if args.cost_curve else None
    except CostCurveFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    budget: DraftBudget
    if nodes_given is None and cost is not None:
        budget, sized = CostAwareBudget(cost), "cost-aware budget"
    else:
        nodes = nodes_given if nodes_given is not None else _SIM_BUDGET
        budget, sized = FixedBudget(nodes), f"budget {nodes}"
    with _library(args, [method]) as library:
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


def _growth(args: argparse.Namespace) -> int:
    from toolspec.bench.growth import growth_points, read_series
    from toolspec.bench.plots import plot_growth

    series: dict[str, list[tuple[int, int, int]]] = {}
    for path in args.inputs:
        for name, rows in read_series(path).items():
            series[name if name not in series else f"{name} ({path.parent.name})"] = rows
    for name, rows in series.items():
        points = growth_points(rows, args.window)
        print(f"{name}: " + ", ".join(f"{p.library_calls:.0f} calls → MAT {p.mat:.2f}"
                                      for p in points))
    plot_growth(series, args.plot, args.window)
    print(f"wrote {args.plot}")
    return 0


def _table(args: argparse.Namespace) -> int:
    from toolspec.bench.run import format_markdown

    for directory in args.runs:
        print(format_markdown(json.loads((directory / "results.json").read_text())) + "\n")
    return 0


def _bench_library(args: argparse.Namespace) -> int:
    from toolspec.library.bench import measure_library

    results = measure_library(args.directory, args.sizes, args.lookups)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from toolspec.demo import run_demo

    return run_demo(args.model, args.dtype, args.items, args.prepack_linear)


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


@contextmanager
def _library(args: argparse.Namespace, methods: Sequence[str]) -> Iterator[Any]:
    """The call library a run uses: ``--library DIR`` as it is, else (for retrieval methods) a
    fresh one in a temporary directory — a cold start — seeded from ``--seed-library`` if given."""
    from toolspec.bench.methods import RETRIEVAL_METHODS, split_budget
    from toolspec.library import CallLibrary

    drafting = {split_budget(method)[0] for method in methods}
    if not RETRIEVAL_METHODS.intersection(drafting) and args.library is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="toolspec-library-") as scratch:
        with CallLibrary(args.library or scratch) as library:
            if args.seed_library:
                library.import_file(args.seed_library, tenant=args.tenant)
            yield library


def _add_library_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--library", type=Path,
                        help="call library directory for retrieval methods (default: a fresh, "
                             "empty one per run: a cold start filled online in item order)")
    parser.add_argument("--seed-library", type=Path,
                        help="import these calls first (API-Bank JSON or JSON lines): a warm start")
    parser.add_argument("--tenant", default="default", help="library tenant of the run's calls")


def _add_prefill_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-draft-at-prefill", dest="draft_at_prefill", action="store_false",
                        help="the prefill chooses one token, as plain decoding does (default: "
                             "the first draft tree rides on the prefill forward)")


def _call_format(name: str | None):
    from toolspec.formats import get_format

    return get_format(name) if name else None


def _add_format_option(parser: argparse.ArgumentParser) -> None:
    from toolspec.formats import FORMATS

    parser.add_argument("--format", choices=list(FORMATS),
                        help="the tool-call wire format (default: detected from each prompt)")


def _budget(spec: str) -> int | None:
    """``auto`` → None (size trees to the measured cost curve); a number → a fixed node cap."""
    if spec == "auto":
        return None
    if not spec.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of draft nodes, got {spec!r}")
    return int(spec)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolspec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="AR vs speculative decoding on a few API-Bank items")
    _add_model_options(demo)
    demo.add_argument("--items", type=int, default=3)
    demo.set_defaults(handler=_demo)

    bench = commands.add_parser("bench", help="benchmark decoding methods against plain decoding")
    _add_model_options(bench)
    bench.add_argument("--data", help="a JSON file in the API-Bank processed format, "
                                      "bfcl:<category> (e.g. bfcl:live_simple) or "
                                      "nestful:<split> (executable, sgd, glaive, "
                                      "complexfuncbench)")
    bench.add_argument("--limit", type=int, default=None, help="first N items")
    bench.add_argument("--methods", default="ar,pld,oracle",
                       help="comma-separated; ar always runs; NAME@N: that method with its "
                            "trees capped at N nodes (e.g. toolspec@7)")
    bench.add_argument("--budget", default=None, type=_budget,
                       help="draft nodes verified per step: a number, or auto (default) to size "
                            "each tree to this machine's measured cost curve")
    bench.add_argument("--refresh-cost-curve", action="store_true",
                       help="measure this machine's cost curve anew (about half a minute on a "
                            "CPU) instead of reading the cached one: for a machine whose speed "
                            "changed since it was cached")
    bench.add_argument("--max-new-tokens", type=int, default=192)
    bench.add_argument("--out", type=Path,
                       help="write results.json and items.jsonl here; a run into the same folder "
                            "resumes after the items it finished")
    bench.add_argument("--plot", action="store_true",
                       help="also write the report PNGs (speed-up, first steps, tool history, "
                            "acceptance) into --out")
    _add_format_option(bench)
    _add_library_options(bench)
    _add_prefill_option(bench)
    bench.set_defaults(handler=_bench)
    bench_commands = bench.add_subparsers(dest="bench_command")
    cost = bench_commands.add_parser("cost-curve", help="forward cost of k tokens vs one token")
    _add_model_options(cost)
    cost.add_argument("--prefix", type=int, default=300, help="cached prefix length")
    cost.add_argument("--max-k", type=int, default=128)
    cost.add_argument("--repeats", type=int, default=5)
    cost.add_argument("--out", type=Path)
    cost.add_argument("--plot", type=Path, help="write a PNG of the curve here")
    cost.add_argument("--compare", type=Path, nargs="*", default=[],
                      help="other cost_curve.json files to draw on the same plot")
    cost.set_defaults(handler=_cost_curve)
    library_bench = bench_commands.add_parser(
        "library", help="call library import rate and lookup latency as it grows")
    library_bench.add_argument("directory", type=Path, help="a new or empty directory")
    library_bench.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    library_bench.add_argument("--lookups", type=int, default=2000)
    library_bench.add_argument("--out", type=Path, help="write the results as JSON here")
    library_bench.set_defaults(handler=_bench_library)
    growth = bench_commands.add_parser(
        "growth", help="plot MAT vs calls stored (cold start) from sim reports or bench items")
    growth.add_argument("inputs", type=Path, nargs="+",
                        help="`toolspec sim --json` reports run with a library, or items.jsonl")
    growth.add_argument("--window", type=int, default=25, help="items per point")
    growth.add_argument("--plot", type=Path, required=True, help="the PNG to write")
    growth.set_defaults(handler=_growth)
    table = bench_commands.add_parser("table", help="results.json of bench runs as Markdown tables")
    table.add_argument("runs", type=Path, nargs="+", help="--out folders of toolspec bench")
    table.set_defaults(handler=_table)
    plot = bench_commands.add_parser("plot", help="the report PNGs for finished bench runs")
    plot.add_argument("runs", type=Path, nargs="+", help="--out folders of toolspec bench")
    plot.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    plot.add_argument("--prefix", default="", help="prefix of the PNG file names")
    plot.add_argument("--rescore", action="store_true",
                      help="score call accuracy / format adherence of runs that predate them "
                           "(reloads the data set and the model's tokenizer)")
    plot.add_argument("--model", default=DEFAULT_MODEL, help="tokenizer for --rescore")
    plot.set_defaults(handler=_plot)
    report = bench_commands.add_parser(
        "report", help="run every data set of a report config, then write the Markdown report "
                       "and its PNGs (docs/report.md, docs/img/report_*.png)")
    report.add_argument("--config", type=Path, default=Path("docs/report.toml"))
    report.add_argument("--limit", type=int, default=None,
                        help="at most N items per data set (a short version of the report)")
    report.add_argument("--no-run", action="store_true",
                        help="only aggregate the runs already in the config's out folder")
    report.add_argument("--rescore", action="store_true",
                        help="score runs recorded before call accuracy existed")
    report.add_argument("--command-line", default=None,
                        help="the command to name in the report (default: this one)")
    report.set_defaults(handler=_report)

    sim = commands.add_parser("sim", help="replay known outputs through a drafter, no model")
    sim.add_argument("--data", required=True, help="API-Bank JSON file or bfcl:<category>")
    sim.add_argument("--limit", type=int, default=None)
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
    sim.add_argument("--json", type=Path, help="write the report here")
    sim.add_argument("--step-ends", type=Path,
                     help="write every step that ended before the output here (JSON lines: "
                          "the missed token, its call state, the text before it, and whether "
                          "the drafter had proposed it)")
    _add_format_option(sim)
    _add_library_options(sim)
    _add_prefill_option(sim)
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
    if args.handler is _bench and args.data is None:
        parser.error("bench needs --data PATH (or the cost-curve subcommand)")
    if args.handler is _bench and args.plot and args.out is None:
        parser.error("--plot writes into --out DIR: give one")
    try:
        return args.handler(args)
    except (ModelError, DatasetFormatError, UnknownMethodError, LibraryError,
            GrowthInputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
