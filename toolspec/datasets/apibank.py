"""API-Bank as processed by the ToolSpec authors: ``system`` + ``user`` text, ground-truth calls.

Each record is ``{"system": str, "user": str, "answer": call | [call, ...], "other": {...}}`` where
a call is ``{"name": str, "parameters": {...}}``. Any file of that shape loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).parent / "samples"


class DatasetFormatError(ValueError):
    """A dataset file is not in the expected format; the message names the file and record."""


@dataclass(frozen=True)
class BenchItem:
    id: str
    messages: tuple[Mapping[str, str], ...]  # chat messages, ready for the chat template
    reference_calls: tuple[Mapping[str, Any], ...]  # {"name": ..., "arguments": {...}}


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
        items.append(BenchItem(
            id=f"{path.stem}-{index}",
            messages=(
                {"role": "system", "content": record["system"]},
                {"role": "user", "content": record["user"]},
            ),
            reference_calls=_reference_calls(record["answer"], where),
        ))
    return items
