"""BFCL v4 (Berkeley Function Calling Leaderboard) from the ``bfcl-eval`` package's data files.

``bfcl:<category>`` names a single-turn category whose ground truth ships with the package:
``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``live_simple``,
``live_multiple``, ``live_parallel``, ``live_parallel_multiple``, ``simple_java``,
``simple_javascript``. Questions are JSON lines with chat messages and function definitions;
ground truths list the acceptable values of each argument. The package is installed with
``--no-deps`` and never imported: its files are located on disk.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolspec.bench.datasets.items import BenchItem, DatasetFormatError
from toolspec.calls.tools import ToolSet

PACKAGE = "bfcl_eval"
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23"
# Single-turn categories with function definitions and ground-truth calls (BFCL's AST set).
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple",
              "live_multiple", "live_parallel", "live_parallel_multiple", "simple_java",
              "simple_javascript")
# Categories whose parameters are typed in another language; BFCL passes them as strings.
STRING_TYPED = {"simple_java": "Java", "simple_javascript": "JavaScript"}


def data_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / "data").is_dir():
            return Path(location) / "data"
    raise DatasetFormatError(f"BFCL data needs the bfcl-eval package: {INSTALL_HINT}")


def categories() -> list[str]:
    """The categories this loader reads whose files are present."""
    directory = data_dir()
    return [c for c in CATEGORIES if (directory / f"BFCL_v4_{c}.json").is_file()]


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reference_calls(ground_truth: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """One concrete call per ground-truth entry: each argument's first acceptable value.

    An argument whose first acceptable value is ``""`` is optional and left out (BFCL's way of
    writing "may be omitted"). A nested object's acceptable values are resolved the same way.
    """
    return tuple({"name": name, "arguments": _first_values(arguments)}
                 for entry in ground_truth for name, arguments in entry.items())


def _first_values(arguments: Mapping[str, list[Any]]) -> dict[str, Any]:
    chosen = {}
    for key, values in arguments.items():
        if values and values[0] != "":
            chosen[key] = _resolved(values[0])
    return chosen


def _resolved(value: Any) -> Any:
    """A value with every nested object of acceptable values (all its values lists, BFCL's
    way inside dict and list arguments) replaced by its first choices."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return _first_values(value)
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    return value


def answers(ground_truth: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The ground truth as scoring takes it: per call its name and acceptable values."""
    return tuple({"name": name, "arguments": arguments}
                 for entry in ground_truth for name, arguments in entry.items())


def _string_typed(function: Mapping[str, Any], language: str) -> dict[str, Any]:
    """``function`` with every parameter a string holding a ``language`` value (as BFCL runs
    these categories: their types — ``HashMap``, ``String``, ``any`` — are not JSON Schema)."""
    parameters = dict(function.get("parameters") or {})
    properties = {}
    for name, schema in (parameters.get("properties") or {}).items():
        kind = schema.get("type", "any")
        description = str(schema.get("description", "")).rstrip()
        properties[name] = {
            "type": "string",
            "description": f"{description} This is {language} {kind} type parameter in string "
                           f"representation.".strip(),
        }
    parameters.update(type="object", properties=properties)
    return {**function, "parameters": parameters}


def load_bfcl(category: str, limit: int | None = None) -> list[BenchItem]:
    """The first ``limit`` items (all when None) of a category, in file order."""
    if category not in CATEGORIES:
        raise DatasetFormatError(
            f"BFCL category {category!r} is not supported (multi-turn, agentic and irrelevance "
            f"categories have no single ground-truth call); supported: {', '.join(CATEGORIES)}")
    directory = data_dir()
    questions_path = directory / f"BFCL_v4_{category}.json"
    answers_path = directory / "possible_answer" / f"BFCL_v4_{category}.json"
    if not questions_path.is_file() or not answers_path.is_file():
        raise DatasetFormatError(
            f"BFCL category {category!r}: data or answers missing in {directory}; present: "
            f"{', '.join(categories())}")
    truths = {a["id"]: a["ground_truth"] for a in _json_lines(answers_path)}
    language = STRING_TYPED.get(category)
    items = []
    for record in _json_lines(questions_path)[:limit]:
        turns = record["question"]
        messages = tuple(turns[0]) if turns and isinstance(turns[0], list) else tuple(turns)
        functions = [_string_typed(f, language) if language else f for f in record["function"]]
        tools = ToolSet.from_functions(functions)
        if record["id"] not in truths:
            raise DatasetFormatError(f"{answers_path}: no ground truth for {record['id']}")
        truth = truths[record["id"]]
        items.append(BenchItem(
            id=record["id"],
            messages=messages,
            reference_calls=reference_calls(truth),
            tools=tools,
            openai_tools=tuple(tool.openai() for tool in tools),
            answers=answers(truth),
        ))
    return items
