"""What travels between the ingress and a model replica: frozen, picklable, no pydantic.

The ingress admits an HTTP request into a ``ChatRequest``; the replica answers with a
``StreamStart``, one ``TextStep`` per decoding step (several tokens when drafts are accepted)
and a ``StreamEnd``. The errors both sides raise live here too (``ContextLengthError`` and its
message), so neither imports the other's layer to name them. Nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolspec.calls.output import CallSpan
from toolspec.calls.tools import ToolSet

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
    top_k: int = 0
    stop: tuple[str, ...] = ()
    session_id: str | None = None
    tenant: str = "default"
    # ``response_format``: the JSON schema a non-call answer follows (json_object: any object).
    answer_schema: Mapping[str, Any] | None = None
    # The prompt as the ingress rendered it (chat template, then the tokenizer of ``model``):
    # the replica runs these ids when its loaded model is ``prompt_model``.
    prompt_ids: tuple[int, ...] | None = None
    prompt_model: str | None = None
    call_format: str | None = None
    # Wall-clock time (``time.time()``) after which the request is ended with an error.
    deadline: float | None = None

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
        """Whether decoding is grammar-constrained: calls are forced, must be strict, or the
        answer must follow ``response_format``. Otherwise (``auto``) it is lossless
        speculation of the model's own output."""
        return (self.forces_call or (self.parses_calls and self.strict)
                or self.answer_schema is not None)

    @property
    def parallel_calls(self) -> bool:
        """Whether the answer may hold several calls (a named choice makes exactly one)."""
        return self.parallel_tool_calls and self.tool_choice != "named"


@dataclass(frozen=True)
class StreamStart:
    """Sent once, before any text: how to read the output that follows."""

    call_format: str  # a name in toolspec.calls.formats.FORMATS
    prompt_tokens: int
    replica: str  # which replica serves the request (session pinning is observable)
    constrained: bool = False  # decoding was grammar-constrained (schema-valid calls)


@dataclass(frozen=True)
class TextStep:
    """One decoding step: the visible text it added, how many tokens it emitted, and where the
    output's calls lie (the request's one parse of its output, made on the replica: offsets
    into the whole output text, which may run ahead of the visible text)."""

    text: str
    tokens: int
    calls: tuple[CallSpan, ...] = ()


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
    cached_tokens: int = 0  # prompt tokens taken from the replica's prefix cache
    decode_rows: int = 0  # forward rows its decoding ran (``Generation.decode_rows``)


ErrorKind = Literal["context_length_exceeded", "deadline_exceeded", "internal_error"]


@dataclass(frozen=True)
class StreamError:
    """Sent instead of ``StreamEnd`` when the replica ended the request with an error: a
    request the ingress could not judge (the prompt longer than the replica's model takes),
    one past its deadline, or a failure (``message`` then says no more than the kind; the
    replica's log holds the details under the request id)."""

    kind: ErrorKind
    message: str


ReplicaEvent = StreamStart | TextStep | StreamEnd | StreamError


class ReplicaUnavailableError(RuntimeError):
    """The model replica could not take or finish the request (it died or was shut down)."""


class ReplicaBusyError(ReplicaUnavailableError):
    """Every model replica is busy and the queue in front of them is full (backpressure);
    ``retry_after_s``: when to try again."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ContextLengthError(ValueError):
    """A prompt (after the chat template) that, with the answer's tokens, does not fit the
    model's context."""


def context_message(prompt_tokens: int, max_tokens: int, context: int) -> str:
    """How a too-long prompt is worded, alike at the ingress (a 400) and on the replica."""
    return (f"the prompt is {prompt_tokens} tokens (after the chat template) and max_tokens "
            f"asks for {max_tokens} more; the model's context holds {context} tokens")
