"""Options and helpers the ``toolspec`` commands share (model, library, prefill, format,
budget)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolspec.model.packages import DEFAULT_MODEL, REGISTRY


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"registered name ({', '.join(REGISTRY)}), a local HF directory or a "
                             f"hub id (default: {DEFAULT_MODEL})")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                        help="auto: bf16 where the hardware runs it fast, else fp32")
    parser.add_argument("--prepack-linear", action=argparse.BooleanOptionalAction, default=True,
                        help="fp32 on CPU: linear weights prepacked for oneDNN at load, which "
                             "makes plain steps faster and verification forwards cheap "
                             "(default; --no-prepack-linear: PyTorch's stock kernels)")
    parser.add_argument("--exact-bf16", action="store_true",
                        help="bf16 on CPU: every generated token's logits bitwise those of a "
                             "one-row step (linear layers in fixed 64-row tiles, attention row "
                             "by row), so speculative outputs equal plain decoding's")


@contextmanager
def open_library(args: argparse.Namespace, methods: Sequence[str]) -> Iterator[Any]:
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


def add_library_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--library", type=Path,
                        help="call library directory for retrieval methods (default: a fresh, "
                             "empty one per run: a cold start filled online in item order)")
    parser.add_argument("--seed-library", type=Path,
                        help="import these calls first (API-Bank JSON or JSON lines): a warm start")
    parser.add_argument("--tenant", default="default", help="library tenant of the run's calls")


def add_prefill_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-draft-at-prefill", dest="draft_at_prefill", action="store_false",
                        help="the prefill chooses one token, as plain decoding does (default: "
                             "the first draft tree rides on the prefill forward)")


def format_named(name: str | None):
    from toolspec.calls.formats import get_format

    return get_format(name) if name else None


def add_format_option(parser: argparse.ArgumentParser) -> None:
    from toolspec.calls.formats import FORMATS

    parser.add_argument("--format", choices=list(FORMATS),
                        help="the tool-call wire format (default: detected from each prompt)")


def budget_spec(spec: str) -> int | None:
    """``auto`` → None (size trees to the measured cost curve); a number → a fixed node cap."""
    if spec == "auto":
        return None
    if not spec.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a number of draft nodes, got {spec!r}")
    return int(spec)
