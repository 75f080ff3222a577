"""Tool sets: the functions a request may call, with their JSON-Schema parameters.

Built from an OpenAI ``tools`` list (validated with ``jsonschema``) or parsed from the API-Bank
system prompt text ("Name: ...", "Parameters: {python dict}"), so the drafting FSM is driven by
real schemas in both cases.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError


class ToolSchemaError(ValueError):
    """A tool definition is malformed; the message names the tool and the problem."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call. ``strict`` (OpenAI's ``function.strict``): its calls must
    follow ``parameters`` exactly, which the server enforces with constrained decoding."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    @property
    def properties(self) -> Mapping[str, Mapping[str, Any]]:
        return self.parameters.get("properties", {}) or {}

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", ()) or ())

    def parameter_order(self) -> tuple[str, ...]:
        """Parameter names, required ones first, each group in schema order."""
        required = [name for name in self.properties if name in self.required]
        optional = [name for name in self.properties if name not in self.required]
        return tuple(required + optional)

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": dict(self.parameters),
        }}


@dataclass(frozen=True)
class ToolSet:
    tools: tuple[Tool, ...]

    def __post_init__(self) -> None:
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ToolSchemaError(f"tool names must be unique; repeated: {', '.join(duplicates)}")

    def __len__(self) -> int:
        return len(self.tools)

    def __iter__(self):
        return iter(self.tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.tools)

    def get(self, name: str) -> Tool | None:
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]]) -> ToolSet:
        """From the OpenAI ``tools`` request field; every parameters schema is checked."""
        return cls(tuple(_tool_from_openai(entry, index) for index, entry in enumerate(tools)))

    @classmethod
    def from_functions(cls, functions: Iterable[Mapping[str, Any]]) -> ToolSet:
        """From bare function definitions ``{"name", "description", "parameters"}`` (BFCL style)."""
        return cls.from_openai([{"type": "function", "function": f} for f in functions])

    @classmethod
    def from_apibank_prompt(cls, system_prompt: str) -> ToolSet:
        """From the "Available Tools" section of an API-Bank system prompt (empty if none)."""
        tools = []
        for match in _APIBANK_TOOL.finditer(system_prompt):
            name, description, raw = match.group("name", "description", "parameters")
            tools.append(_validated(Tool(name.strip(), (description or "").strip(),
                                         _apibank_parameters(name.strip(), raw))))
        return cls(tuple(tools))


_APIBANK_TOOL = re.compile(
    r"^\d+\. Name: (?P<name>[^\n]+)\n(?:Description: (?P<description>[^\n]*)\n)?"
    r"Parameters: (?P<parameters>[^\n]*)$",
    re.MULTILINE,
)

# API-Bank writes Python type names; these are their JSON-Schema equivalents.
_APIBANK_TYPES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "list": {"type": "array"},
    "list(str)": {"type": "array", "items": {"type": "string"}},
    "dict": {"type": "object"},
}


def _apibank_parameters(tool: str, raw: str) -> dict[str, Any]:
    try:
        declared = ast.literal_eval(raw)
    except (ValueError, SyntaxError) as error:
        raise ToolSchemaError(
            f"tool {tool!r}: Parameters is not a Python dict literal ({error})") from None
    if not isinstance(declared, dict):
        raise ToolSchemaError(
            f"tool {tool!r}: Parameters must be a dict, got {type(declared).__name__}")
    properties = {}
    for name, spec in declared.items():
        kind = spec.get("type", "str") if isinstance(spec, dict) else "str"
        schema = dict(_APIBANK_TYPES.get(kind, {"type": "string"}))
        if isinstance(spec, dict) and spec.get("description"):
            schema["description"] = spec["description"]
        properties[name] = schema
    # API-Bank does not mark optional parameters; the reference calls give all of them.
    return {"type": "object", "properties": properties, "required": list(properties)}


def _tool_from_openai(entry: Mapping[str, Any], index: int) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(entry, Mapping):
        raise ToolSchemaError(f"{where}: expected an object, got {type(entry).__name__}")
    if entry.get("type", "function") != "function":
        raise ToolSchemaError(
            f"{where}: only type 'function' is supported, got {entry.get('type')!r}")
    function = entry.get("function")
    if not isinstance(function, Mapping):
        raise ToolSchemaError(f"{where}: missing the 'function' object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(f"{where}: function.name must be a non-empty string")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping):
        raise ToolSchemaError(f"tool {name!r}: parameters must be a JSON Schema object")
    strict = function.get("strict", False)
    if not isinstance(strict, bool):
        raise ToolSchemaError(f"tool {name!r}: strict must be true or false, got {strict!r}")
    return _validated(Tool(name, str(function.get("description") or ""), _normalized(parameters),
                           strict))


def json_type(schema: Mapping[str, Any]) -> str | None:
    """A schema's single JSON type (``["string", "null"]`` counts as ``string``), or None when
    it names none or several."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def pinned_values(schema: Mapping[str, Any]) -> list[Any]:
    """Values the schema pins down: ``enum`` / ``const`` members, booleans, null."""
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return list(schema["enum"])
    kind = json_type(schema)
    if kind == "boolean":
        return [True, False]
    if kind == "null":
        return [None]
    return []


def _normalized(schema: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL writes ``"type": "dict"`` (and Python type names) where JSON Schema says ``object``."""
    aliases = {"dict": "object", "float": "number", "int": "integer", "str": "string",
               "bool": "boolean", "list": "array", "tuple": "array", "any": None}
    fixed: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value in aliases:
            if aliases[value] is not None:
                fixed[key] = aliases[value]
        elif key in ("properties",) and isinstance(value, Mapping):
            fixed[key] = {name: _normalized(sub) if isinstance(sub, Mapping) else sub
                          for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            fixed[key] = _normalized(value)
        else:
            fixed[key] = value
    return fixed


def _validated(tool: Tool) -> Tool:
    try:
        jsonschema.validators.validator_for(tool.parameters).check_schema(tool.parameters)
    except SchemaError as error:
        path = "/".join(str(p) for p in error.path) or "(root)"
        raise ToolSchemaError(
            f"tool {tool.name!r}: invalid parameters schema at {path}: {error.message}"
        ) from None
    if tool.parameters.get("type", "object") != "object":
        raise ToolSchemaError(
            f"tool {tool.name!r}: parameters must be an object schema, got type "
            f"{tool.parameters.get('type')!r}"
        )
    return tool
