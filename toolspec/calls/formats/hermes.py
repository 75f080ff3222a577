"""Hermes / Qwen2.5 chat-template calls: each call in its own ``<tool_call>`` block."""

from toolspec.calls.formats.base import CallFormat


class HermesFormat(CallFormat):
    name = "hermes"
    arguments_key = "arguments"
    call_open = "<tool_call>\n"
    call_close = "\n</tool_call>"
    separator = "\n"
