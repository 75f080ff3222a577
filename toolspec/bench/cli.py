"""``toolspec bench …`` commands: bench, cost-curve, library, growth, table, plot, report.

``add_bench_commands(subparsers)`` registers them on the ``toolspec`` parser's subparsers; each
handler (``args.handler``) returns an exit code and prints errors, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from toolspec.bench.cli_options import (
    add_format_option,
    add_library_options,
    add_model_options,
    add_prefill_option,
    budget_spec,
    format_named,
    open_library,
)
from toolspec.bench.datasets import DatasetFormatError
from toolspec.model.loading import LoadedModel, dtype_name
from toolspec.model.packages import DEFAULT_MODEL


def add_bench_commands(commands: Any) -> None:
    """Register ``bench`` and its subcommands on ``commands`` (an argparse subparsers action)."""
    bench = commands.add_parser("bench", help="benchmark decoding methods against plain decoding")
    add_model_options(bench)
    bench.add_argument("--data", help="a JSON file in the API-Bank processed format, a .jsonl "
                                      "file of OpenAI chat requests (your own traffic: "
                                      "messages, tools, optional reference_calls), "
                                      "bfcl:<category> (e.g. bfcl:live_simple) or "
                                      "nestful:<split> (executable, sgd, glaive, "
                                      "complexfuncbench)")
    bench.add_argument("--limit", type=int, default=None, help="first N items")
    bench.add_argument("--skip", type=int, default=0,
                       help="leave out the first N items (a data set's tuning part): --limit "
                            "then counts from there")
    bench.add_argument("--methods", default="ar,pld,oracle",
                       help="comma-separated; ar always runs; NAME@N: that method with its "
                            "trees capped at N nodes (e.g. toolspec@7)")
    bench.add_argument("--budget", default=None, type=budget_spec,
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
    bench.add_argument("--concurrency", type=_levels, default=None,
                       help="e.g. 1,2,4,8: instead of one request at a time, N clients send the "
                            "items (a closed loop), batched into every forward as a replica "
                            "does; writes concurrency.json and concurrency.png into --out")
    add_format_option(bench)
    add_library_options(bench)
    add_prefill_option(bench)
    bench.set_defaults(handler=_bench)
    bench_commands = bench.add_subparsers(dest="bench_command")
    cost = bench_commands.add_parser("cost-curve", help="forward cost of k tokens vs one token")
    add_model_options(cost)
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
                       "and its PNGs (docs/report-<dtype>.md, docs/img/report-<dtype>_*.png)")
    report.add_argument("--config", type=Path, default=Path("docs/report.toml"))
    report.add_argument("--limit", type=int, default=None,
                        help="at most N items per data set (a short version of the report)")
    report.add_argument("--dtype", dest="report_dtype", choices=["auto", "bf16", "fp16", "fp32"],
                        help="run in this dtype instead of the config's (auto: bf16 where the "
                             "hardware runs it fast, else fp32)")
    report.add_argument("--exact-bf16", dest="report_exact_bf16", action="store_true",
                        help="run with --exact-bf16 instead of the config's setting; "
                             "its runs and page are apart from the default ones (<dtype>-exact)")
    report.add_argument("--methods", dest="report_methods", default=None,
                        help="these methods instead of the config's (e.g. ar,toolspec)")
    report.add_argument("--no-run", action="store_true",
                        help="only aggregate the runs already in the config's out folder (its "
                             "subfolder for the dtype)")
    report.add_argument("--rescore", action="store_true",
                        help="score runs recorded before call accuracy existed")
    report.add_argument("--command-line", default=None,
                        help="the command to name in the report (default: this one)")
    report.set_defaults(handler=_report)


def bench_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with a ``toolspec bench`` command line argparse accepted (None: nothing)."""
    if args.handler is not _bench:
        return None
    if args.data is None:
        return "bench needs --data PATH (or the cost-curve subcommand)"
    if args.plot and args.out is None:
        return "--plot writes into --out DIR: give one"
    return None


def _parse_bench(argv: list[str]) -> argparse.Namespace:
    """``argv`` (``["bench", ...]``) parsed as typed, so every option left out takes its
    default."""
    parser = argparse.ArgumentParser(prog="toolspec")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def _bench(args: argparse.Namespace) -> int:
    from toolspec.bench.datasets import load_dataset
    from toolspec.bench.methods import parse_methods
    from toolspec.bench.resume import ITEMS_FILE, ResultLog, ResumeMismatchError, claim_folder
    from toolspec.bench.run import (
        build_engines,
        format_table,
        results_document,
        run_items,
        summarize,
        write_summary,
    )
    from toolspec.core.engine import GenerationParams
    from toolspec.model.cost_curve import cached_cost_model
    from toolspec.model.loading import freeze_loaded_objects, load_model

    methods = parse_methods(args.methods)
    items = load_dataset(args.data, args.limit, args.skip)
    if not items:
        print(f"{args.data}: no items", file=sys.stderr)
        return 2
    loaded = load_model(args.model, dtype=args.dtype, prepack_linear=args.prepack_linear,
                        exact_bf16=args.exact_bf16)
    if args.concurrency:
        return _bench_concurrency(args, loaded, items, methods)
    if args.out:
        try:
            claim_folder(args.out, _run_settings(args, loaded))
        except ResumeMismatchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    cost = None if args.budget is not None else cached_cost_model(
        loaded, refresh=args.refresh_cost_curve)
    engines = build_engines(loaded, methods, args.budget, args.draft_at_prefill, cost)
    freeze_loaded_objects()
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    log = ResultLog(args.out / ITEMS_FILE, [item.id for item in items], methods) \
        if args.out else None
    finished = log.finished if log else {}
    if finished:
        print(f"resuming: {len(finished)} items already done in {args.out}/{ITEMS_FILE}")
    with open_library(args, methods) as library:
        seeded = library.stats().calls if library is not None else None
        results = [log.record(r) if log else r for r in run_items(
            engines, loaded.tokenizer, items, methods, params,
            call_format=format_named(args.format), library=library, tenant=args.tenant,
            finished=finished)]
    if log:
        log.close()
    summary = summarize(results, methods)
    document = results_document(loaded, [item.id for item in items], summary, {
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
                  f"{divergence['position']} (ar top-1/top-2 logit margin "
                  f"{divergence['ar_margin']})")
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


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give levels like 1,2,4,8") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: levels are whole numbers of at least 1")
    return levels


def _bench_concurrency(args: argparse.Namespace, loaded: LoadedModel, items: list[Any],
                       methods: list[str]) -> int:
    from toolspec.bench.concurrency import run_levels, write_document
    from toolspec.bench.run import build_engines
    from toolspec.core.engine import GenerationParams
    from toolspec.model.cost_curve import cached_cost_model
    from toolspec.model.loading import freeze_loaded_objects
    from toolspec.model.machine import describe_machine

    if "oracle" in methods:
        print("error: the oracle drafts plain decoding's output of the same item: it has no "
              "meaning under --concurrency", file=sys.stderr)
        return 2
    cost = None if args.budget is not None else cached_cost_model(
        loaded, refresh=args.refresh_cost_curve)
    engines = build_engines(loaded, methods, args.budget, args.draft_at_prefill, cost)
    freeze_loaded_objects()
    levels = run_levels(engines, loaded.tokenizer, items, methods, args.concurrency,
                        GenerationParams(max_new_tokens=args.max_new_tokens),
                        tenant=args.tenant)
    document = {"model": loaded.name, "dtype": dtype_name(loaded.dtype), "data": str(args.data),
                "items": len(items), "draft_budget": args.budget or "auto",
                "max_new_tokens": args.max_new_tokens,
                "machine": describe_machine(loaded.device), "levels": levels}
    if args.out:
        for path in write_document(args.out, document):
            print(f"wrote {path}")
    return 0


def _run_settings(args: argparse.Namespace, loaded: LoadedModel) -> dict[str, Any]:
    """What a bench run's results depend on besides its items and methods, the code that
    measures them included: a run into an ``--out`` folder resumes only with the same (the
    machine's state may differ: runs are interleaved item by item, so its speed-ups stay side by
    side)."""
    from toolspec.bench.resume import measuring_code_digest

    return {"model": loaded.name, "dtype": dtype_name(loaded.dtype),
            "prepacked_linear": loaded.prepacked_linear, "exact_bf16": loaded.exact_bf16,
            "data": str(args.data),
            "skip": args.skip,
            "draft_budget": args.budget or "auto", "max_new_tokens": args.max_new_tokens,
            "format": args.format, "draft_at_prefill": args.draft_at_prefill,
            "library": None if args.library is None else str(args.library),
            "seed_library": None if args.seed_library is None else str(args.seed_library),
            "tenant": args.tenant, "toolspec_code": measuring_code_digest()}


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
    from toolspec.bench.datasets import load_dataset
    from toolspec.bench.report import rescored
    from toolspec.model.packages import load_tokenizer

    data = str(run.document.get("data"))
    try:
        items = load_dataset(data, run.document.get("items"))
    except DatasetFormatError as error:
        print(f"warning: {run.name}: not rescored ({error})", file=sys.stderr)
        return run
    return rescored(run, items, load_tokenizer(run.document.get("model") or model))


def _report(args: argparse.Namespace) -> int:
    from toolspec.bench.analysis import RunReadError, read_run
    from toolspec.bench.methods import UnknownMethodError, parse_methods
    from toolspec.bench.report import ReportConfigError, load_config, write_report
    from toolspec.model.loading import default_device, parse_dtype

    try:
        config = load_config(args.config).limited(args.limit)
        if args.report_dtype:
            config = replace(config, dtype=args.report_dtype)
        if args.report_exact_bf16:
            config = replace(config, exact_bf16=True)
        if args.report_methods:
            parse_methods(args.report_methods)
            config = replace(config, methods=args.report_methods)
    except (ReportConfigError, UnknownMethodError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # One folder per dtype the config's resolves to here: a bf16 machine and an fp32 one each
    # resume their own runs. Exact bf16 rounds apart from default bf16: its own folder and page.
    dtype = dtype_name(parse_dtype(config.dtype, default_device()))
    variant = f"{dtype}-exact" if config.exact_bf16 else dtype
    runs_dir = config.out / variant
    if not args.no_run:
        for dataset in config.datasets:
            print(f"== {dataset.name}: {dataset.data}, {dataset.limit or 'all'} items "
                  f"({dataset.tuning})")
            # Parsed like a typed command, so every other option takes its bench default.
            argv = ["bench", "--model", config.model, "--dtype", config.dtype,
                    "--data", dataset.data, "--methods", config.methods,
                    "--budget", config.budget, "--max-new-tokens", str(config.max_new_tokens),
                    "--prepack-linear" if config.prepack_linear else "--no-prepack-linear",
                    *(["--exact-bf16"] if config.exact_bf16 else []),
                    "--out", str(runs_dir / dataset.name)]
            if dataset.limit is not None:
                argv += ["--limit", str(dataset.limit)]
            if dataset.dev_items:
                argv += ["--skip", str(dataset.dev_items)]
            code = _bench(_parse_bench(argv))
            if code:
                return code
    try:
        runs = [read_run(runs_dir / d.name, d.name) for d in config.datasets]
    except RunReadError as error:
        print(f"error: {error} (run the report without --no-run first)", file=sys.stderr)
        return 2
    if args.rescore:
        runs = [_rescored(run, config.model) for run in runs]
    command = " ".join(["toolspec", *sys.argv[1:]]) if args.command_line is None \
        else args.command_line
    # A page per dtype too, so the bf16 report and the fp32 one stand side by side.
    page, images = write_report(runs, config.docs, command, name=f"report-{variant}",
                                datasets=config.datasets)
    for path in (page, *images):
        print(f"wrote {path}")
    return 0


def _cost_curve(args: argparse.Namespace) -> int:
    from toolspec.model.cost_curve import (
        DEFAULT_SIZES,
        cost_curve_document,
        format_cost_curve,
        measure_cost_curve,
    )
    from toolspec.model.loading import load_model
    from toolspec.model.machine import describe_machine
    from toolspec.model.target_model import TargetModel

    loaded = load_model(args.model, dtype=args.dtype, prepack_linear=args.prepack_linear,
                        exact_bf16=args.exact_bf16)
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
    from toolspec.bench.library_bench import measure_library

    results = measure_library(args.directory, args.sizes, args.lookups)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0
