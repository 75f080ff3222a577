"""Objects and arrays the prompt spells out, which a model may copy into a call as a value.

Prompts describe tools with literals — API-Bank writes each tool's parameters as a Python dict
(``{'token': {'type': 'str', 'description': 'The token of the user.'}}``), chat templates write
OpenAI tools as JSON — and a small model sometimes passes such a literal as an argument: the
parameter's own schema instead of a value, in JSON. ``nested_literals`` finds every object and
array inside the prompt's literals, each with the key that holds it, so a drafter can continue
one the model has begun to write. Pure text, no state.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from typing import Any, NamedTuple

_OPENERS = {"{": "}", "[": "]"}
_MAX_LITERAL = 20_000  # characters; longer bracketed stretches are not read as one literal
# Characters examined in all, per text: many brackets that never close (code, a run of ``[``)
# would otherwise each be followed to the end.
_MAX_SCANNED = 200_000


class NestedLiteral(NamedTuple):
    key: str | None  # the key whose value it is (None: an array element or a top-level literal)
    value: dict | list


def nested_literals(text: str) -> list[NestedLiteral]:
    """Every object and array of every literal in ``text`` (JSON, or a Python literal of
    dicts, lists, strings, numbers, booleans and None), outermost first, in text order; the
    search stops after ``_MAX_SCANNED`` characters examined."""
    found: list[NestedLiteral] = []
    at, budget = 0, _MAX_SCANNED
    while at < len(text) and budget > 0:
        if text[at] not in _OPENERS:
            at += 1
            continue
        end, examined = _literal_end(text, at)
        budget -= examined
        value = _parse(text[at:end]) if end is not None else None
        if value is None or not _json_writable(value):
            at += 1
            continue
        found.extend(_walk(None, value))
        at = end
    return found


def _literal_end(text: str, start: int) -> tuple[int | None, int]:
    """Offset just past the bracket that closes ``text[start]``, skipping quoted strings
    (None when it is not closed, or mismatched, within ``_MAX_LITERAL`` characters), and how
    many characters were examined to find out."""
    expected: list[str] = []
    quote: str | None = None
    escaped = False
    stop = min(len(text), start + _MAX_LITERAL)
    for at in range(start, stop):
        char = text[at]
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            elif char == "\n":
                return None, at + 1 - start  # a quote open at a line's end: prose
            continue
        if char in "\"'":
            quote = char
        elif char in _OPENERS:
            expected.append(_OPENERS[char])
        elif char in "}]":
            if not expected or expected.pop() != char:
                return None, at + 1 - start
            if not expected:
                return at + 1, at + 1 - start
    return None, stop - start


def _parse(literal: str) -> Any:
    """``literal`` as JSON, else as a Python literal; None when it is neither."""
    try:
        return json.loads(literal)
    except ValueError:
        pass
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _json_writable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):  # sets, bytes, complex numbers
        return False
    return True


def _walk(key: str | None, value: Any) -> Iterator[NestedLiteral]:
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            yield NestedLiteral(key, value)
            for inner_key, inner in value.items():
                yield from _walk(inner_key, inner)
    elif isinstance(value, list):
        yield NestedLiteral(key, value)
        for inner in value:
            yield from _walk(None, inner)
