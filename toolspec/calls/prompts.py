"""Turning a request's chat messages (and tools) into prompt ids and the expected call format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallFormat, detect_format


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    call_format: CallFormat | None = None,
) -> tuple[list[int], CallFormat]:
    """Prompt ids from the model's chat template, and the format its calls will take
    (``call_format`` if given, else detected from the prompt and the template)."""
    text = tokenizer.apply_chat_template(
        list(messages), tools=list(tools) if tools else None, add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids, call_format or detect_format(text, tokenizer.chat_template)


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of every message but the system prompt: where argument values come from."""
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") != "system")
