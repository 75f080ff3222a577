"""``toolspec library …`` commands: import, stats, export.

``add_library_commands(subparsers)`` registers them on the ``toolspec`` parser's subparsers; each
handler (``args.handler``) returns an exit code and prints errors, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from toolspec.library.errors import LibraryError
from toolspec.library.metadata import META_FILE
from toolspec.library.store import CallLibrary


def default_library_dir() -> Path:
    """``$TOOLSPEC_HOME/library`` (``~/.cache/toolspec/library`` by default)."""
    from toolspec import toolspec_home

    return toolspec_home() / "library"


def _library(args: argparse.Namespace, create: bool) -> CallLibrary:
    path = Path(args.library) if args.library else default_library_dir()
    if not create and not (path / META_FILE).exists():
        raise LibraryError(f"{path}: no call library here; create one with "
                           f"`toolspec library import FILE --library {path}`")
    return CallLibrary(path)


def _import(args: argparse.Namespace) -> int:
    with _library(args, create=True) as library:
        count = library.import_file(args.path, tenant=args.tenant)
        calls = library.stats().calls
    print(f"imported {count} calls from {args.path} into {library.path} ({calls} distinct calls)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    with _library(args, create=False) as library:
        stats = library.stats()
    if args.json:
        print(json.dumps(asdict(stats), indent=2))
    else:
        print(f"{library.path}: {stats.calls} calls, {stats.tenants} tenants, {stats.tools} tools, "
              f"{len(stats.shard_calls)} shards {list(stats.shard_calls)}, "
              f"{stats.disk_bytes / 2**20:.1f} MiB on disk "
              f"({stats.used_bytes / 2**20:.1f} MiB used)")
    return 0


def _export(args: argparse.Namespace) -> int:
    with _library(args, create=False) as library:
        count = library.export(args.path, tenant=args.tenant)
    print(f"exported {count} calls to {args.path}")
    return 0


Handler = Callable[[argparse.Namespace], int]


def _guarded(handler: Handler) -> Handler:
    """``handler`` printing library and file errors as one line and returning 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (LibraryError, OSError) as error:
            print(f"toolspec library: {error}", file=sys.stderr)
            return 2
    run.__name__ = handler.__name__
    return run


def add_library_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``library {import,stats,export}`` to ``subparsers``; returns the ``library`` parser.

    Each leaf parser sets ``handler``: call ``args.handler(args)`` to get the exit code.
    """
    library = subparsers.add_parser("library", help="the call library of past tool calls")
    commands = library.add_subparsers(dest="library_command", required=True)

    def leaf(name: str, help: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help)
        parser.add_argument("--library", default=None, metavar="DIR",
                            help="library directory (default: $TOOLSPEC_HOME/library)")
        return parser

    parser = leaf("import", "add the calls of an API-Bank JSON or a JSON-lines file")
    parser.add_argument("path", metavar="PATH")
    parser.add_argument("--tenant", default="default",
                        help="tenant of calls whose line names none (default: default)")
    parser.set_defaults(handler=_guarded(_import))

    parser = leaf("stats", "counts and sizes")
    parser.add_argument("--json", action="store_true", help="print the stats as JSON")
    parser.set_defaults(handler=_guarded(_stats))

    parser = leaf("export", "write the calls as JSON lines")
    parser.add_argument("path", metavar="PATH")
    parser.add_argument("--tenant", default=None, help="export this tenant only")
    parser.set_defaults(handler=_guarded(_export))
    return library
