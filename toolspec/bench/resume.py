"""Resumable ``toolspec bench`` runs: an ``--out`` folder's result log and its settings.

A folder holds ``items.jsonl`` (one ``ItemResult`` per item and method, appended as each one
finishes) and ``run.json`` (the settings the results were measured with). A later run into the
same folder keeps every result it does not replace: items outside its ``--limit`` and methods
outside its ``--methods`` stay in the log, so a short or partial run never deletes a long one's
work. A run with other settings (model, dtype, data, budget, ...) is refused rather than mixed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from toolspec.bench.run import ItemResult

ITEMS_FILE = "items.jsonl"
SETTINGS_FILE = "run.json"


# Modules that only present or drive runs: editing them changes no measured figure.
_PRESENTATION_MODULES = frozenset({
    "cli.py", "cli_options.py", "demo.py", "library/cli.py", "bench/cli.py", "bench/report.py",
    "bench/plots.py", "bench/analysis.py", "bench/growth.py"})


def measuring_code_digest(package: Path = Path(__file__).parent.parent) -> str:
    """A digest of the ``toolspec`` sources a run's figures depend on (every module but the
    ones that only present results): a resumed run must decode and draft with the same code."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative not in _PRESENTATION_MODULES:
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class ResumeMismatchError(ValueError):
    """An ``--out`` folder holding results measured with other settings than this run's."""


def read_item_results(items_jsonl: Path) -> list[ItemResult]:
    """Every line of ``items_jsonl`` (unknown keys of newer files are ignored). A last line
    cut short (a run killed while writing it) is left out: its item runs again."""
    known = {f.name for f in fields(ItemResult)}
    lines = [line for line in items_jsonl.read_text().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise
    return [ItemResult(**{k: v for k, v in row.items() if k in known}) for row in rows]


def claim_folder(out: Path, settings: Mapping[str, Any]) -> None:
    """Record ``settings`` in ``out/run.json``, or raise ``ResumeMismatchError`` if the folder
    holds results of a run whose settings differ. A folder with results but no ``run.json``
    (written before it existed) is taken as matching. Mutates: ``out/run.json``."""
    recorded_path = out / SETTINGS_FILE
    current = json.loads(json.dumps(dict(settings)))  # as it reads back: tuples as lists, ...
    if recorded_path.is_file():
        recorded = json.loads(recorded_path.read_text())
        differing = [f"{key} {recorded.get(key)!r} (this run: {current.get(key)!r})"
                     for key in sorted(set(recorded) | set(current))
                     if recorded.get(key) != current.get(key)]
        if differing:
            raise ResumeMismatchError(
                f"{out} holds results measured with {', '.join(differing)}; rerun with those "
                f"settings to resume, or give another --out (or delete {out})")
    out.mkdir(parents=True, exist_ok=True)
    recorded_path.write_text(json.dumps(current, indent=2) + "\n")


def _line(result: ItemResult) -> str:
    return json.dumps(asdict(result)) + "\n"


class ResultLog:
    """``items.jsonl`` of an ``--out`` folder, opened for a run of ``item_ids`` x ``methods``.

    ``finished`` holds the earlier results of the run's items that every one of ``methods`` has
    finished; the run's other items are run again (``ar`` first, so every method is timed side
    by side with the same ``ar`` run), and opening drops their earlier results. Everything else
    the file holds stays. Mutates: the file.
    """

    def __init__(self, items_jsonl: Path, item_ids: Sequence[str], methods: Sequence[str]) -> None:
        earlier = read_item_results(items_jsonl) if items_jsonl.exists() else []
        by_item: dict[str, dict[str, ItemResult]] = {}
        for result in earlier:
            by_item.setdefault(result.item, {})[result.method] = result
        self.finished: dict[str, dict[str, ItemResult]] = {
            item: {m: by_item[item][m] for m in methods} for item in item_ids
            if item in by_item and all(m in by_item[item] for m in methods)}
        self._rerun = set(item_ids) - set(self.finished)
        items_jsonl.parent.mkdir(parents=True, exist_ok=True)
        # Rewritten beside and renamed over it: an interrupted open loses no finished result.
        kept = items_jsonl.with_name(items_jsonl.name + ".tmp")
        with open(kept, "w") as handle:
            handle.writelines(_line(r) for r in earlier if r.item not in self._rerun)
        os.replace(kept, items_jsonl)
        self._handle = open(items_jsonl, "a")

    def record(self, result: ItemResult) -> ItemResult:
        """Append ``result`` unless it is one of ``finished`` (already in the file)."""
        if result.item in self._rerun:
            self._write_all([result])
        return result

    def _write_all(self, results: Iterable[ItemResult]) -> None:
        self._handle.writelines(_line(result) for result in results)
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
