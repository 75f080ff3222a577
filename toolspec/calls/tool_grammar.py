"""The grammar of a request's tool calls, as llguidance Lark text, from its tool schemas.

A call is ``call_open {"name": "<tool>", "<arguments key>": <arguments> } call_close`` inside
the format's ``block_open`` ... ``block_close``, the arguments constrained by the tool's
parameters JSON schema (llguidance ``%json``). Two shapes:

- ``calls``: the output is the calls block and nothing else (``tool_choice`` required or named);
- ``text_or_calls``: free text, and once the call opening appears the calls that follow are
  constrained (``strict`` with ``tool_choice`` auto). Text after the calls block is not allowed.
  With a ``response_format`` schema, the JSON answer it describes takes the place of free text.

A format that wraps its calls (``<tool_call>``) also takes them bare (``{"name": ...}``), and a
few whitespace characters may follow the last call: the model ends where it would end
unconstrained (end of turn is allowed wherever the grammar is complete). ``parallel`` allows
several calls (separated by the format's ``separator``); otherwise exactly one. JSON is written in
the default style (``{"a": 1, "b": 2}``, see ``formats.DEFAULT_STYLE``): the mask fixes the
spacing, so only the model's choices of names and values remain.

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

from toolspec.calls.formats import CallFormat
from toolspec.calls.tools import Tool

GrammarShape = Literal["calls", "text_or_calls"]

# Passed to llguidance's JSON compiler inside every %json block.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NAME_OPENING = '{"name": '


class UnconstrainableToolError(ValueError):
    """A tool's parameters schema uses JSON-Schema features the grammar compiler does not
    support (so its calls cannot be guaranteed valid); the message names the tool."""


def added_token_ids(tokenizer: Any) -> dict[str, int]:
    """The tokenizer's added-token texts and their ids (what ``tool_call_grammar`` writes as
    ids)."""
    return {token.content: index for index, token in tokenizer.added_tokens_decoder.items()}


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
                      parallel: bool, added_tokens: Mapping[str, int],
                      answer: Mapping[str, Any] | None = None) -> str:
    """Lark text (llguidance dialect) of ``shape`` over ``tools`` in ``call_format``.

    ``added_tokens`` maps the tokenizer's added-token texts to their ids (see the module
    docstring). ``answer``: a JSON schema (``response_format``) that a non-call answer must
    follow; with it, ``text_or_calls`` allows that JSON document instead of free text.
    Raises ValueError for an empty tool list.
    """
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")
    literal = _Literals(added_tokens)
    fmt = call_format
    separator = literal(fmt.separator)
    more = (lambda call: f"({separator} {call})*") if parallel else (lambda call: "")
    rules = [
        f"call_body: {literal(_NAME_OPENING)} tail",
        "tail: " + " | ".join(f"tool_{index}" for index in range(len(tools))),
        f"call: {literal(fmt.call_open)} call_body {literal(fmt.call_close)}",
        f"wrapped: {literal(fmt.block_open)} call {more('call')} {literal(fmt.block_close)}",
        f"trail: {_TRAIL}",
    ]
    for index, tool in enumerate(tools):
        head = json.dumps(tool.name) + f', "{fmt.arguments_key}": '
        rules.append(f"tool_{index}: {literal(head)} %json {json.dumps(arguments_schema(tool))}"
                     f' {literal("}")}')
    # A format that wraps its calls also takes them bare, as models often write them (Qwen2.5
    # answers `auto` with bare objects): a constrained call is then the one the model would
    # write, and it ends where the model ends.
    wraps = bool(fmt.block_open or fmt.call_open)
    if wraps:
        rules.append(f"bare: call_body {more('call_body')}")
    calls = "wrapped | bare" if wraps else "wrapped"
    if shape == "calls":
        start = f"start: ({calls}) trail?"
    elif answer is not None:
        # A bare call and a JSON answer both start with "{": one JSON grammar holds both, so
        # the parse never has to guess which it is in.
        replies = [answer_schema(answer)]
        if wraps:
            replies += [call_schema(tool, fmt.arguments_key) for tool in tools]
        start = "start: reply trail?" + (" | wrapped trail?" if wraps else "")
        rules.append(f"reply: %json {json.dumps(_flexible({'anyOf': replies}))}")
    else:
        start = f"start: TEXT | {_text_then_calls(fmt, literal, more, wraps, rules)}"
        rules.append(r"TEXT: /(.|\n)*/")
    return "\n".join([start, *rules]) + "\n"


def answer_grammar(schema: Mapping[str, Any]) -> str:
    """Lark text of an answer that is one JSON document following ``schema``
    (``response_format`` without tools), then at most a little whitespace."""
    return (f"start: answer trail?\nanswer: %json {json.dumps(answer_schema(schema))}\n"
            f"trail: {_TRAIL}\n")


def answer_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as a ``response_format`` answer follows it: JSON spaced as the model likes
    (unlike calls, whose spacing the drafts assume), objects that declare ``properties``
    closed as in calls."""
    return _flexible(closed_schema(schema))


def call_schema(tool: Tool, arguments_key: str) -> dict[str, Any]:
    """A bare call of ``tool`` as one JSON schema: ``{"name": <tool>, <key>: <arguments>}``."""
    return {"type": "object", "additionalProperties": False,
            "required": ["name", arguments_key],
            "properties": {"name": {"const": tool.name},
                           arguments_key: closed_schema(tool.parameters)}}


def _flexible(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": {"whitespace_flexible": True}}


def check_answer_schema(schema: Mapping[str, Any]) -> None:
    """Raises UnconstrainableToolError when ``schema`` cannot be enforced (cheap: no
    tokenizer needed)."""
    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(answer_grammar(schema)))
    if error:
        raise UnconstrainableToolError(
            f"response_format's JSON schema cannot be enforced by constrained decoding "
            f"({grammar_message(error)})")


# After the last call (or the answer), a few whitespace characters before the end of the
# turn: Qwen2.5 writes "</tool_call>\n" and then ends. Bounded, so a model that would go on
# cannot loop on whitespace.
_TRAIL = r"/[ \t\r\n]{1,4}/"


def _text_then_calls(fmt: CallFormat, literal: _Literals, more: Any, wraps: bool,
                     rules: list[str]) -> str:
    """Rules for free text, then the first call and the rest; returns the alternatives of
    ``start`` that hold a call. The text ends at the first added token of the opening (free
    text cannot hold one) or, without one, lazily at the first occurrence of the whole opening
    (block, call and ``{"name": ``); the call's tail is then constrained. A bare call starts
    after text ending (lazily) in ``{"name": ``."""
    opening = fmt.block_open + fmt.call_open + _NAME_OPENING
    first = literal.first_added(opening)
    close = f"{literal(fmt.call_close)} {more('call')} {literal(fmt.block_close)} trail?"
    if first is not None:
        # The text before the added token (a fence) stays free: it is part of TEXT.
        rest = opening[opening.index(first):]
        rules.append(f"first_call: TEXT {literal(rest)} tail {close}")
    else:
        rules += [f"first_call: text_then_opening tail {close}",
                  f"text_then_opening[lazy]: TEXT {json.dumps(opening, ensure_ascii=False)}"]
    if not wraps:
        return "first_call"
    rules += [f"first_bare: text_then_bare tail {more('call_body')} trail?",
              f"text_then_bare[lazy]: TEXT {json.dumps(_NAME_OPENING)}"]
    return "first_call | first_bare"


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
