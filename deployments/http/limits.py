"""Limits a request must stay within, and the checks on the raw body that come before parsing.

Every limit is a setting (``AppConfig.limits``, ``serve_config.yaml``) and every refusal a 400
whose message states the limit, so that no request can cost a replica more than the operator
allowed: the body's size is checked before it is parsed, its nesting and its text (strings a
tokenizer can take) before it is validated, the counts of messages and tools and the size of
each tool's schema before anything is rendered, and the prompt's length (after the chat
template) before any model work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AdmissionLimits(BaseModel):
    """What one request may ask for; each refusal is a 400 naming the limit. The deployment's
    ``limits`` setting is this model (defined once, checked at deploy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(4 << 20, ge=1024, description="checked before parsing")
    max_json_depth: int = Field(64, ge=8, description="nesting of the request body's JSON")
    max_messages: int = Field(1024, ge=1)
    max_tools: int = Field(128, ge=1)
    max_tool_schema_bytes: int = Field(32 << 10, ge=256, description="JSON size of one tool")
    max_tool_schema_depth: int = Field(24, ge=4, description="JSON nesting of one tool")
    context_tokens: int | None = Field(
        None, ge=16, description="prompt (after the chat template) + max_tokens; default: "
                                 "the model's own context")


class BodyLimitError(ValueError):
    """The raw body breaks a limit; ``param`` names the field when one is to blame."""

    def __init__(self, message: str, param: str | None = None,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def load_json_body(raw: bytes, limits: AdmissionLimits) -> Any:
    """The JSON document in ``raw``. Raises BodyLimitError (too large, too deeply nested,
    a string no tokenizer can take) or ValueError (not JSON)."""
    if len(raw) > limits.max_body_bytes:
        raise BodyLimitError(f"the request body is {len(raw)} bytes; this server takes at most "
                             f"{limits.max_body_bytes}", code="request_too_large")
    try:
        return json.loads(raw)
    except RecursionError:
        raise BodyLimitError(f"the request body nests JSON more than {limits.max_json_depth} "
                             "levels deep", code="nested_too_deep") from None


def check_document(document: Any, limits: AdmissionLimits) -> None:
    """Raises BodyLimitError for nesting deeper than ``limits.max_json_depth`` or a string
    holding text that is not Unicode (a lone surrogate such as ``"\\udcff"``: JSON escapes
    can spell one, no tokenizer can encode it). Iterative: deep documents cost no recursion."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(document, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, Mapping):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            if isinstance(value, str) and not _is_unicode(value):
                raise BodyLimitError(f"{json_path(path)} holds text that is not valid Unicode "
                                     "(a lone surrogate escape such as \\udcff)",
                                     param=json_path(path), code="invalid_text")
            continue
        if depth > limits.max_json_depth:
            raise BodyLimitError(f"the request body nests JSON more than "
                                 f"{limits.max_json_depth} levels deep (at {json_path(path)})",
                                 param=json_path(path), code="nested_too_deep")
        for key, item in items:
            if isinstance(key, str) and not _is_unicode(key):
                raise BodyLimitError(f"a key in {json_path(path)} is not valid Unicode",
                                     param=json_path(path), code="invalid_text")
            if isinstance(item, (Mapping, list, str)):
                stack.append((item, depth + 1, (*path, key)))


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar: 0). Iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            stack.extend((item, depth + 1) for item in node.values())
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def json_path(path: tuple[str | int, ...]) -> str:
    """``("messages", 2, "content")`` → ``messages[2].content`` (OpenAI's ``param`` style)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
