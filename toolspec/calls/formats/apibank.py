"""API-Bank (ToolSpec processing): one fenced ``<tool_call>`` block, one call per line."""

from toolspec.calls.formats.base import CallFormat


class ApiBankFormat(CallFormat):
    name = "apibank"
    arguments_key = "parameters"
    block_open = "```<tool_call>\n"
    separator = "\n"
    block_close = "\n</tool_call>\n```"
