"""Llama 3.1 JSON tool calling: ``{"name": ..., "parameters": {...}}``."""

from toolspec.calls.formats.base import CallFormat


class Llama3JsonFormat(CallFormat):
    name = "llama3_json"
    arguments_key = "parameters"
    separator = "\n"
