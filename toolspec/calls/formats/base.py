"""What every tool-call wire format shares: the call type, JSON style, render and parse.

A format is the JSON call object ``{"name": ..., "<arguments key>": {...}}`` plus the fixed text
around it: ``block_open`` before the first call, ``call_open``/``call_close`` around each call,
``separator`` between calls and ``block_close`` after the last one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolspec.calls.formats.scanner import CallScanner


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JsonStyle:
    """How a model spaces JSON: ``{"a": 1, "b": 2}`` (the default), ``{"a":1,"b":2}``, or one
    key per line with ``indent`` per nesting level (``json.dumps(..., indent=2)``).

    The gaps are given per nesting ``level`` (1 for a call object, 2 for its arguments).
    """

    colon: str = ": "
    comma: str = ", "
    indent: str | None = None

    def dumps(self, value: Any) -> str:
        if self.indent is None:
            return json.dumps(value, ensure_ascii=False, separators=(self.comma, self.colon))
        return json.dumps(value, ensure_ascii=False, indent=self.indent,
                          separators=(self.comma.rstrip(), self.colon))

    @property
    def inline_comma(self) -> str:
        """Between the elements of an array, which models write on one line in every style."""
        return self.comma if self.indent is None else self.comma.rstrip() + " "

    def dumps_at(self, value: Any, level: int) -> str:
        """``value`` laid out as a model writes it at nesting ``level`` (that of its keys, if
        an object): as ``dumps`` without an indent; with one, an object one key per line and
        an array on one line."""
        if self.indent is None:
            return self.dumps(value)
        if isinstance(value, dict) and value:
            members = [json.dumps(str(key), ensure_ascii=False) + self.colon
                       + self.dumps_at(item, level + 1) for key, item in value.items()]
            return ("{" + self.opening_gap(level) + self.separator(level).join(members)
                    + self.closing_gap(level) + "}")
        return json.dumps(value, ensure_ascii=False, separators=(self.inline_comma, self.colon))

    def opening_gap(self, level: int) -> str:
        """Between an object's ``{`` and its first key."""
        return "" if self.indent is None else "\n" + self.indent * level

    def separator(self, level: int) -> str:
        """Between a value and the next key."""
        return (self.comma if self.indent is None
                else self.comma.rstrip() + "\n" + self.indent * level)

    def closing_gap(self, level: int) -> str:
        """Between an object's last value and its ``}``."""
        return "" if self.indent is None else "\n" + self.indent * (level - 1)


DEFAULT_STYLE = JsonStyle()
COMPACT_STYLE = JsonStyle(":", ",")
INDENTED_STYLE = JsonStyle(": ", ",", "  ")


class CallFormat:
    """Base of the wire formats; subclasses only set the class constants."""

    name: ClassVar[str]
    arguments_key: ClassVar[str] = "arguments"
    block_open: ClassVar[str] = ""
    call_open: ClassVar[str] = ""
    call_close: ClassVar[str] = ""
    separator: ClassVar[str] = "\n"
    block_close: ClassVar[str] = ""

    def call_object(self, call: ToolCall) -> dict[str, Any]:
        return {"name": call.name, self.arguments_key: dict(call.arguments)}

    def render_call(self, call: ToolCall, style: JsonStyle = DEFAULT_STYLE) -> str:
        return self.call_open + style.dumps(self.call_object(call)) + self.call_close

    def render(self, calls: Sequence[ToolCall], style: JsonStyle = DEFAULT_STYLE) -> str:
        """The canonical text of ``calls`` in this format."""
        body = self.separator.join(self.render_call(call, style) for call in calls)
        return self.block_open + body + self.block_close

    def scanner(self) -> CallScanner:
        """An incremental parser for outputs in this format (any arguments key accepted)."""
        others = tuple(k for k in ("arguments", "parameters") if k != self.arguments_key)
        return CallScanner(arguments_keys=(self.arguments_key, *others))

    def parse(self, text: str) -> list[ToolCall]:
        """The well-formed calls in ``text`` (surrounding prose and wrappers are ignored)."""
        scanner = self.scanner()
        scanner.feed(text)
        return [
            ToolCall(call.name, call.arguments)
            for call in scanner.calls
            if call.name is not None and call.arguments is not None
        ]

    def __repr__(self) -> str:
        return f"<CallFormat {self.name}>"


def parse_arguments_json(arguments: str | Mapping[str, Any]) -> Mapping[str, Any]:
    """OpenAI messages carry arguments as a JSON string; accept both forms."""
    return json.loads(arguments) if isinstance(arguments, str) else arguments
