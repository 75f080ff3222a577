"""A user's own traffic: OpenAI chat-completion requests, one JSON object per line.

What a user exports from their logs: each line holds ``messages`` and ``tools`` (OpenAI form),
optionally ``tool_choice`` and the calls the answer should hold — ``reference_calls`` (``[{"name",
"arguments"}]``) or an assistant message's ``tool_calls`` under ``expected`` — so that call
accuracy can be scored. Other request fields (``model``, ``temperature``...) are ignored: the
benchmark decodes greedily with its own settings. Tools go through the model's chat template,
as serving renders them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolspec.bench.datasets.items import BenchItem, DatasetFormatError
from toolspec.calls.formats import parse_arguments_json
from toolspec.calls.tools import ToolSchemaError, ToolSet


def load_requests(path: str | Path, limit: int | None = None) -> list[BenchItem]:
    """The first ``limit`` requests of a JSON-lines file (all when None). Raises
    DatasetFormatError naming the line of a request it cannot read."""
    path = Path(path)
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: no such file") from None
    items = []
    for number, line in enumerate(lines[:limit] if limit is not None else lines, start=1):
        where = f"{path}:{number}"
        try:
            request = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetFormatError(f"{where}: not a JSON object ({error})") from None
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            raise DatasetFormatError(f"{where}: a request needs a 'messages' list")
        tools = None
        if request.get("tools"):
            try:
                tools = ToolSet.from_openai(request["tools"])
            except ToolSchemaError as error:
                raise DatasetFormatError(f"{where}: {error}") from None
        items.append(BenchItem(
            id=str(request.get("id") or f"{path.stem}-{number}"),
            messages=tuple(_template_message(m, where) for m in request["messages"]),
            reference_calls=_reference_calls(request, where),
            tools=tools,
            openai_tools=tuple(tool.openai() for tool in tools) if tools else None,
        ))
    return items


def _template_message(message: Any, where: str) -> Mapping[str, Any]:
    """A message as the chat template takes it (call arguments as objects)."""
    if not isinstance(message, dict) or "role" not in message:
        raise DatasetFormatError(f"{where}: every message needs a 'role'")
    entry = {key: value for key, value in message.items() if key != "tool_calls"}
    if isinstance(entry.get("content"), list):
        entry["content"] = "".join(str(part.get("text", "")) for part in entry["content"])
    entry["content"] = entry.get("content") or ""
    if message.get("tool_calls"):
        entry["tool_calls"] = [{"type": "function", "id": call.get("id"), "function": {
            "name": call["function"]["name"],
            "arguments": dict(_arguments(call["function"].get("arguments"), where))}}
            for call in message["tool_calls"]]
    return entry


def _reference_calls(request: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], ...]:
    if "reference_calls" in request:
        return tuple({"name": call["name"], "arguments": dict(call.get("arguments") or {})}
                     for call in request["reference_calls"])
    expected = request.get("expected") or {}
    return tuple({"name": call["function"]["name"],
                  "arguments": dict(_arguments(call["function"].get("arguments"), where))}
                 for call in expected.get("tool_calls") or ())


def _arguments(arguments: Any, where: str) -> Mapping[str, Any]:
    if arguments in (None, ""):
        return {}
    try:
        parsed = parse_arguments_json(arguments)
    except (json.JSONDecodeError, TypeError) as error:
        raise DatasetFormatError(f"{where}: call arguments are not a JSON object ({error})") \
            from None
    if not isinstance(parsed, Mapping):
        raise DatasetFormatError(f"{where}: call arguments are not a JSON object")
    return parsed
