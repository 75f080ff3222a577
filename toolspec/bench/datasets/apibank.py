"""API-Bank as processed by the ToolSpec authors: ``system`` + ``user`` text, ground-truth calls.

Each record is ``{"system": str, "user": str, "answer": call | [call, ...], "other": {...}}`` where
a call is ``{"name": str, "parameters": {...}}``. Any file of that shape loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolspec.bench.datasets.items import BenchItem, DatasetFormatError
from toolspec.calls.tools import ToolSchemaError, ToolSet

SAMPLES = Path(__file__).parent / "samples"
API_BANK = Path(__file__).parent / "api_bank"  # the processed sets, shipped (see its README.md)
LEVELS = ("level-1", "level-2")


def apibank_path(level: str) -> Path:
    """The shipped file of an API-Bank level (``level-1`` or ``level-2``)."""
    if level not in LEVELS:
        raise DatasetFormatError(f"unknown API-Bank set {level!r}: use one of "
                                 f"{', '.join('apibank:' + name for name in LEVELS)}")
    return API_BANK / f"{level}.json"


def apibank_file(spec: str) -> Path:
    """``apibank:<level>`` → the shipped file; anything else is a path to an API-Bank JSON file
    (for command-line options that read the raw records)."""
    if spec.startswith("apibank:"):
        return apibank_path(spec.removeprefix("apibank:"))
    return Path(spec)


def sample_path(name: str = "apibank-level1-sample.json") -> Path:
    """A small API-Bank sample shipped with the package (used by the demo and tests)."""
    return SAMPLES / name


def _reference_calls(answer: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    calls = answer if isinstance(answer, list) else [answer]
    parsed = []
    for call in calls:
        if not isinstance(call, dict) or "name" not in call:
            raise DatasetFormatError(f"{where}: each answer call needs a 'name', got {call!r}")
        parsed.append({"name": call["name"], "arguments": call.get("parameters", {})})
    return tuple(parsed)


def load_apibank(path: str | Path, limit: int | None = None) -> list[BenchItem]:
    path = Path(path)
    try:
        records = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise DatasetFormatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(records, list):
        raise DatasetFormatError(f"{path}: expected a JSON list of records")
    items = []
    for index, record in enumerate(records[:limit] if limit is not None else records):
        where = f"{path}[{index}]"
        missing = [key for key in ("system", "user", "answer") if key not in record]
        if missing:
            raise DatasetFormatError(f"{where}: missing {', '.join(missing)}")
        try:
            tools = ToolSet.from_apibank_prompt(record["system"])
        except ToolSchemaError as error:
            raise DatasetFormatError(f"{where}: {error}") from None
        items.append(BenchItem(
            id=f"{path.stem}-{index}",
            messages=(
                {"role": "system", "content": record["system"]},
                {"role": "user", "content": record["user"]},
            ),
            reference_calls=_reference_calls(record["answer"], where),
            tools=tools if len(tools) else None,
        ))
    return items
