"""The one item type every benchmark dataset loads into."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolspec.calls.tools import ToolSet


class DatasetFormatError(ValueError):
    """A dataset is missing or not in the expected format; the message says which and how."""


@dataclass(frozen=True)
class BenchItem:
    id: str
    messages: tuple[Mapping[str, str], ...]  # chat messages, ready for the chat template
    reference_calls: tuple[Mapping[str, Any], ...]  # {"name": ..., "arguments": {...}}
    tools: ToolSet | None = None  # the callable tools, as schemas
    # Tools to hand to the chat template (OpenAI form); None when the prompt already lists them.
    openai_tools: tuple[Mapping[str, Any], ...] | None = None
    # What scoring accepts, BFCL style: per expected call ``{"name", "arguments": {parameter:
    # [acceptable values]}}``, ``""`` among the values meaning "may be left out"; None: exactly
    # ``reference_calls``.
    answers: tuple[Mapping[str, Any], ...] | None = None
    ordered: bool = False  # the calls must come in reference order (a nested sequence)
