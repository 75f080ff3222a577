"""The grammar of a request's tool calls, as llguidance Lark text, from its tool schemas.

A call is ``call_open {"name": "<tool>", "<arguments key>": <arguments> } call_close`` inside
the format's ``block_open`` ... ``block_close``, the arguments constrained by the tool's
parameters JSON schema (llguidance ``%json``). Two shapes:

- ``calls``: the output is the calls block and nothing else (``tool_choice`` required or named);
- ``text_or_calls``: free text, and once the call opening appears the calls that follow are
  constrained (``strict`` with ``tool_choice`` auto). Text after the calls block is not allowed.

``parallel`` allows several calls (separated by the format's ``separator``); otherwise exactly
one. JSON is written in the default style (``{"a": 1, "b": 2}``, see ``formats.DEFAULT_STYLE``):
the mask fixes the spacing, so only the model's choices of names and values remain.

Object schemas that declare ``properties`` but say nothing of ``additionalProperties`` are
closed (``additionalProperties: false``) before compiling: a constrained call never invents
a parameter, and is still valid against the original schema.

Wrapper text that the tokenizer holds as one added token (Qwen's ``<tool_call>``) is written as
that token (``<[id]>``): llguidance matches added tokens only by id, never by their bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from llguidance import LLMatcher

from toolspec.formats import CallFormat
from toolspec.tools import Tool

GrammarShape = Literal["calls", "text_or_calls"]

# Passed to llguidance's JSON compiler inside every %json block.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NAME_OPENING = '{"name": '


class UnconstrainableToolError(ValueError):
    """A tool's parameters schema uses JSON-Schema features the grammar compiler does not
    support (so its calls cannot be guaranteed valid); the message names the tool."""


def closed_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with ``additionalProperties: false`` on every object schema that declares
    ``properties`` and leaves ``additionalProperties`` unsaid, at any depth. Pure."""
    def close(node: Any) -> Any:
        if isinstance(node, Mapping):
            fixed = {key: close(value) for key, value in node.items()}
            if "properties" in fixed and "additionalProperties" not in fixed:
                fixed["additionalProperties"] = False
            return fixed
        if isinstance(node, list):
            return [close(item) for item in node]
        return node

    return close(dict(schema))


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The schema the constrained arguments follow: closed, with llguidance's JSON options."""
    return {**closed_schema(tool.parameters), "x-guidance": _JSON_OPTIONS}


def check_constrainable(tools: Sequence[Tool]) -> None:
    """Raises UnconstrainableToolError for the first tool whose schema llguidance cannot
    compile (no tokenizer needed: cheap enough for admission)."""
    for tool in tools:
        grammar = LLMatcher.grammar_from_lark(f"start: %json {json.dumps(arguments_schema(tool))}")
        error = LLMatcher.validate_grammar(grammar)
        if error:
            raise UnconstrainableToolError(
                f"tool {tool.name!r}: its parameters schema cannot be enforced by constrained "
                f"decoding ({grammar_message(error)}); drop 'strict' / tool_choice or simplify "
                "the schema")


def grammar_message(error: str) -> str:
    """llguidance's error on one line, without its echo of the grammar text."""
    lines = (line.strip() for line in error.splitlines()
             if line.strip() and not _ECHO.match(line))
    return " ".join(lines)


_ECHO = re.compile(r"\s*(\d+ \||\^)")


def tool_call_grammar(tools: Sequence[Tool], call_format: CallFormat, shape: GrammarShape,
                      parallel: bool, added_tokens: Mapping[str, int]) -> str:
    """Lark text (llguidance dialect) of ``shape`` over ``tools`` in ``call_format``.

    ``added_tokens`` maps the tokenizer's added-token texts to their ids (see the module
    docstring). Raises ValueError for an empty tool list.
    """
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")
    literal = _Literals(added_tokens)
    fmt = call_format
    rules = [
        f"call: {literal(fmt.call_open + _NAME_OPENING)} tail {literal(fmt.call_close)}",
        "tail: " + " | ".join(f"tool_{index}" for index in range(len(tools))),
    ]
    for index, tool in enumerate(tools):
        head = json.dumps(tool.name) + f', "{fmt.arguments_key}": '
        rules.append(f"tool_{index}: {literal(head)} %json {json.dumps(arguments_schema(tool))}"
                     f' {literal("}")}')
    more = f"({literal(fmt.separator)} call)*" if parallel else ""
    close = literal(fmt.block_close)
    if shape == "calls":
        start = f"start: {literal(fmt.block_open)} call {more} {close}"
    else:
        start = f"start: TEXT | first_call {more} {close}"
        rules += [*_text_then_first_call(fmt, literal), r"TEXT: /(.|\n)*/"]
    return "\n".join([start, *rules]) + "\n"


def _text_then_first_call(fmt: CallFormat, literal: _Literals) -> list[str]:
    """Rules for free text, then the first call. The text ends at the first added token of the
    opening (free text cannot hold one) or, without one, lazily at the first occurrence of the
    whole opening (block, call and ``{"name": ``); the call's tail is then constrained."""
    opening = fmt.block_open + fmt.call_open + _NAME_OPENING
    first = literal.first_added(opening)
    if first is not None:
        # The text before the added token (a fence) stays free: it is part of TEXT.
        rest = opening[opening.index(first):]
        return [f"first_call: TEXT {literal(rest)} tail {literal(fmt.call_close)}"]
    return [f"first_call: text_then_opening tail {literal(fmt.call_close)}",
            f"text_then_opening[lazy]: TEXT {json.dumps(opening, ensure_ascii=False)}"]


class _Literals:
    """Writes wrapper text as Lark: quoted strings, added tokens as ``<[id]>``."""

    def __init__(self, added_tokens: Mapping[str, int]) -> None:
        self.added = dict(added_tokens)
        texts = sorted((text for text in self.added if text), key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, texts))) if texts else None

    def first_added(self, text: str) -> str | None:
        match = self.pattern.search(text) if self.pattern else None
        return match.group() if match else None

    def __call__(self, text: str) -> str:
        if not text:
            return ""
        parts: list[str] = []
        position = 0
        for match in self.pattern.finditer(text) if self.pattern else ():
            if match.start() > position:
                parts.append(json.dumps(text[position:match.start()], ensure_ascii=False))
            parts.append(f"<[{self.added[match.group()]}]>")
            position = match.end()
        if position < len(text):
            parts.append(json.dumps(text[position:], ensure_ascii=False))
        return " ".join(parts)
