"""BFCL v4 (Berkeley Function Calling Leaderboard) from the ``bfcl-eval`` package's data files.

``bfcl:<category>`` names a category (``simple_python``, ``multiple``, ``parallel``,
``parallel_multiple``, ``live_simple``, ...). Questions are JSON lines with chat messages and
function definitions; ground truths list the acceptable values of each argument. The package is
installed with ``--no-deps`` and never imported: its files are located on disk.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from toolspec.datasets.items import BenchItem, DatasetFormatError
from toolspec.tools import ToolSet

PACKAGE = "bfcl_eval"
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23"


def data_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / "data").is_dir():
            return Path(location) / "data"
    raise DatasetFormatError(f"BFCL data needs the bfcl-eval package: {INSTALL_HINT}")


def categories() -> list[str]:
    return sorted(p.stem.removeprefix("BFCL_v4_") for p in data_dir().glob("BFCL_v4_*.json"))


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reference_calls(ground_truth: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """One concrete call per ground-truth entry: each argument's first acceptable value.

    An argument whose first acceptable value is ``""`` is optional and left out (BFCL's way of
    writing "may be omitted").
    """
    calls = []
    for entry in ground_truth:
        (name, arguments), = entry.items()
        chosen = {key: values[0] for key, values in arguments.items()
                  if values and values[0] != ""}
        calls.append({"name": name, "arguments": chosen})
    return tuple(calls)


def load_bfcl(category: str, limit: int | None = None) -> list[BenchItem]:
    directory = data_dir()
    questions_path = directory / f"BFCL_v4_{category}.json"
    if not questions_path.is_file():
        raise DatasetFormatError(
            f"no BFCL category {category!r}; available: {', '.join(categories())}"
        )
    answers_path = directory / "possible_answer" / f"BFCL_v4_{category}.json"
    answers = ({a["id"]: a["ground_truth"] for a in _json_lines(answers_path)}
               if answers_path.is_file() else {})
    items = []
    for record in _json_lines(questions_path)[:limit]:
        turns = record["question"]
        messages = tuple(turns[0]) if turns and isinstance(turns[0], list) else tuple(turns)
        tools = ToolSet.from_functions(record["function"])
        items.append(BenchItem(
            id=record["id"],
            messages=messages,
            reference_calls=reference_calls(answers.get(record["id"], [])),
            tools=tools,
            openai_tools=tuple(tool.openai() for tool in tools),
        ))
    return items
