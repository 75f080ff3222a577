"""Bare JSON call objects, one per line, optionally inside a ```json fence (Qwen2.5-Coder)."""

from toolspec.calls.formats.base import CallFormat


class JsonFormat(CallFormat):
    name = "json"
    arguments_key = "arguments"
    separator = "\n"
