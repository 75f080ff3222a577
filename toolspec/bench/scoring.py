"""Scoring an output against its item: are the calls right, is it in the expected format?

``call_correct``: the calls parsed from the output are the ground truth's — same number, same
tools, and every argument one of its acceptable values (``BenchItem.answers``, BFCL style, or
exactly ``reference_calls``); an argument whose acceptable values include ``""`` may be left
out, and no other argument may be given. Calls match in any order (parallel calls) unless the
item is ``ordered`` (a nested sequence). Strings match as BFCL compares them (case, spaces and
``,./-_*^`` ignored), numbers by value (an int for a float), and a string parameter given as
text matches a ground truth written as a bare number or boolean (Java / JavaScript values).

``format_adherent``: the output parses as calls in the expected format — at least one call,
every call a well-formed JSON object with a ``name`` and the format's arguments key
(``parameters`` for API-Bank, ``arguments`` otherwise), naming an offered tool. ``wrapped``
also requires the format's fixed text around the calls (``<tool_call>`` tags for hermes, the
fenced block for API-Bank); prose around the calls is allowed in both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolspec.bench.datasets import BenchItem
from toolspec.calls.formats import CallFormat, ToolCall
from toolspec.calls.formats.scanner import ParsedCall
from toolspec.calls.tools import ToolSet

_IGNORED = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class Score:
    call_correct: bool
    format_adherent: bool
    wrapped: bool  # format_adherent and inside the format's wrappers


def score_output(item: BenchItem, text: str, call_format: CallFormat) -> Score:
    """How ``text``, the output on ``item`` written in ``call_format``, scores."""
    return Score(
        call_correct=calls_match(call_format.parse(text), acceptable_calls(item), item.tools,
                                 item.ordered),
        format_adherent=adheres_to_format(text, call_format, item.tools),
        wrapped=adheres_to_format(text, call_format, item.tools, wrappers=True),
    )


def acceptable_calls(item: BenchItem) -> tuple[Mapping[str, Any], ...]:
    """``item.answers``, or its reference calls with each value the only acceptable one."""
    if item.answers is not None:
        return item.answers
    return tuple({"name": call["name"], "arguments": _only_values(call.get("arguments") or {})}
                 for call in item.reference_calls)


def _only_values(arguments: Mapping[str, Any]) -> dict[str, list[Any]]:
    return {key: [_only_values(value) if isinstance(value, dict) else value]
            for key, value in arguments.items()}


def calls_match(calls: Sequence[ToolCall], expected: Sequence[Mapping[str, Any]],
                tools: ToolSet | None = None, ordered: bool = False) -> bool:
    """``calls`` are exactly the ``expected`` ones (acceptable-values form), in order if
    ``ordered``, else in any order."""
    if len(calls) != len(expected):
        return False
    if ordered:
        return all(call_matches(c, e, tools) for c, e in zip(calls, expected))
    return _perfect_matching(list(calls), list(expected), tools)


def _perfect_matching(calls: list[ToolCall], expected: list[Mapping[str, Any]],
                      tools: ToolSet | None) -> bool:
    if not calls:
        return True
    first, rest = calls[0], calls[1:]
    return any(call_matches(first, candidate, tools)
               and _perfect_matching(rest, expected[:i] + expected[i + 1:], tools)
               for i, candidate in enumerate(expected))


def call_matches(call: ToolCall, expected: Mapping[str, Any], tools: ToolSet | None = None
                 ) -> bool:
    if call.name != expected["name"]:
        return False
    tool = tools.get(call.name) if tools is not None else None
    properties = tool.properties if tool is not None else {}
    return _arguments_match(call.arguments, expected["arguments"], properties)


def _arguments_match(given: Mapping[str, Any], acceptable: Mapping[str, Sequence[Any]],
                     properties: Mapping[str, Any]) -> bool:
    if set(given) - set(acceptable):
        return False
    for key, values in acceptable.items():
        if key not in given:
            if "" in values:
                continue
            return False
        if not any(value_matches(given[key], value, properties.get(key) or {})
                   for value in values):
            return False
    return True


def value_matches(given: Any, expected: Any, schema: Mapping[str, Any] | None = None) -> bool:
    """``given`` is ``expected`` (a literal, or an object of acceptable values) under
    ``schema``, the parameter's JSON Schema."""
    schema = schema or {}
    if isinstance(expected, dict):
        if not isinstance(given, dict):
            return False
        properties = schema.get("properties") or {}
        if all(isinstance(v, list) for v in expected.values()) and \
                _arguments_match(given, expected, properties):
            return True
        return set(given) == set(expected) and all(
            value_matches(given[k], expected[k], properties.get(k)) for k in expected)
    if isinstance(expected, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return isinstance(given, list) and len(given) == len(expected) and all(
            value_matches(g, e, items) for g, e in zip(given, expected))
    if isinstance(given, str) and not isinstance(expected, str) and expected is not None \
            and schema.get("type") == "string":
        return _normalized(given) == _normalized(json.dumps(expected))
    if isinstance(expected, bool) or isinstance(given, bool):
        return given is expected
    if isinstance(expected, (int, float)):
        return isinstance(given, (int, float)) and float(given) == float(expected)
    if isinstance(expected, str):
        return isinstance(given, str) and _normalized(given) == _normalized(expected)
    return given == expected


def _normalized(text: str) -> str:
    return _IGNORED.sub("", text).lower().replace("'", '"')


def adheres_to_format(text: str, call_format: CallFormat, tools: ToolSet | None = None,
                      wrappers: bool = False) -> bool:
    """``text`` holds at least one call, each well-formed in ``call_format`` and, with
    ``wrappers``, inside the format's fixed text (see the module)."""
    scanner = call_format.scanner()
    scanner.feed(text)
    calls = scanner.calls
    if not calls:
        return False
    for call in calls:
        if call.name is None or call.arguments is None:
            return False
        if not isinstance(json.loads(call.text).get(call_format.arguments_key), dict):
            return False
        if tools is not None and call.name not in tools.names:
            return False
    return not wrappers or _wrapped(text, calls, call_format)


def _wrapped(text: str, calls: Sequence[ParsedCall], call_format: CallFormat) -> bool:
    opening = _squashed(call_format.block_open + call_format.call_open)
    if not _squashed(text[:calls[0].start]).endswith(opening):
        return False
    for before, after in zip(calls, calls[1:]):
        between = _squashed(text[before.end:after.start])
        close, open_ = _squashed(call_format.call_close), _squashed(call_format.call_open)
        if len(between) < len(close) + len(open_) or not between.startswith(close) \
                or not between.endswith(open_):
            return False
    closing = _squashed(call_format.call_close + call_format.block_close)
    return _squashed(text[calls[-1].end:]).startswith(closing)


def _squashed(text: str) -> str:
    return "".join(text.split())
