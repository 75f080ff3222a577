"""Tool-call wire formats: render, parse, and the incremental scanner they share."""

from __future__ import annotations

from toolspec.calls.formats.apibank import ApiBankFormat
from toolspec.calls.formats.base import (
    COMPACT_STYLE,
    DEFAULT_STYLE,
    INDENTED_STYLE,
    CallFormat,
    JsonStyle,
    ToolCall,
    parse_arguments_json,
)
from toolspec.calls.formats.hermes import HermesFormat
from toolspec.calls.formats.json_calls import JsonFormat
from toolspec.calls.formats.llama3 import Llama3JsonFormat
from toolspec.calls.formats.scanner import CallScanner, CallState, NestedAnchor, NestedContainer

FORMATS: dict[str, CallFormat] = {
    f.name: f for f in (HermesFormat(), JsonFormat(), ApiBankFormat(), Llama3JsonFormat())
}


class UnknownFormatError(ValueError):
    """A format name that is not one of FORMATS."""


def get_format(name: str) -> CallFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise UnknownFormatError(
            f"unknown call format {name!r}; available: {', '.join(FORMATS)}"
        ) from None


def detect_format(prompt_text: str, chat_template: str | None = None) -> CallFormat:
    """The format a request's calls will be written in, from its prompt and chat template.

    API-Bank prompts spell out their fenced block; a chat template that renders ``tools`` into
    ``<tool_call>`` tags (Qwen2.5, Hermes) means hermes; a Llama 3 ``ipython`` template means
    llama3_json; anything else gets bare JSON objects.
    """
    if "```<tool_call>" in prompt_text and '"parameters"' in prompt_text:
        return FORMATS["apibank"]
    if "<tool_call>" in prompt_text:
        return FORMATS["hermes"]
    if chat_template and "<tool_call>" in chat_template:
        return FORMATS["hermes"]
    if chat_template and "ipython" in chat_template:
        return FORMATS["llama3_json"]
    return FORMATS["json"]


__all__ = [
    "COMPACT_STYLE", "DEFAULT_STYLE", "FORMATS", "INDENTED_STYLE", "CallFormat", "CallScanner",
    "CallState", "JsonStyle", "NestedAnchor", "NestedContainer", "ToolCall", "UnknownFormatError",
    "detect_format", "get_format", "parse_arguments_json",
]
