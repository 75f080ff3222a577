"""What travels between the ingress and a model replica: frozen, picklable, no pydantic.

The ingress admits an HTTP request into a ``ChatRequest``; the replica answers with a
``StreamStart``, one ``TextStep`` per decoding step (several tokens when drafts are accepted)
and a ``StreamEnd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from toolspec.tools import ToolSet

ToolChoiceMode = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True)
class ChatRequest:
    """An admitted chat completion request: validated, with its tools parsed.

    ``tools`` are the tools the prompt offers (for ``tool_choice`` named: only that one);
    ``openai_tools`` the same as OpenAI dicts for the chat template. ``tenant`` names whose
    past calls may be drafted. ``strict``: calls must follow their schemas (the request or
    one of its tools asked for it).
    """

    request_id: str
    model: str
    messages: tuple[Mapping[str, Any], ...]
    tools: ToolSet | None = None
    openai_tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: ToolChoiceMode = "auto"
    named_tool: str | None = None
    strict: bool = False
    parallel_tool_calls: bool = True
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    session_id: str | None = None
    tenant: str = "default"

    @property
    def parses_calls(self) -> bool:
        """Whether the output is read for tool calls (tools offered and not turned off)."""
        return self.tools is not None and len(self.tools) > 0 and self.tool_choice != "none"

    @property
    def forces_call(self) -> bool:
        """Whether the output must be tool calls and nothing else (``required`` / named)."""
        return self.parses_calls and self.tool_choice in ("required", "named")

    @property
    def constrained(self) -> bool:
        """Whether decoding is grammar-constrained: calls are forced, or must be strict.
        Otherwise (``auto``) it is lossless speculation of the model's own output."""
        return self.forces_call or (self.parses_calls and self.strict)


@dataclass(frozen=True)
class StreamStart:
    """Sent once, before any text: how to read the output that follows."""

    call_format: str  # a name in toolspec.formats.FORMATS
    prompt_tokens: int
    replica: str  # which replica serves the request (session pinning is observable)
    prefix_reused: int = 0  # prompt tokens whose KV came from the session's earlier turn
    constrained: bool = False  # decoding was grammar-constrained (schema-valid calls)


@dataclass(frozen=True)
class TextStep:
    """One decoding step: the visible text it added and how many tokens it emitted."""

    text: str
    tokens: int


@dataclass(frozen=True)
class StreamEnd:
    """Sent last: why decoding ended and what speculation achieved."""

    finish_reason: Literal["stop", "length"]
    completion_tokens: int
    steps: int  # verification forwards: the steps, and the prefill's when it carried a tree
    accepted_by_source: Mapping[str, int] = field(default_factory=dict)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    mat: float = 0.0  # mean tokens per verification forward (``Generation.mat``)


ReplicaEvent = Union[StreamStart, TextStep, StreamEnd]


class ReplicaUnavailableError(RuntimeError):
    """The model replica could not take or finish the request (it died or was shut down)."""
