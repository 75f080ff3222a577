"""The HTTP edge: OpenAI chat-completion and Responses request bodies, in pydantic.

Only the shape is checked here; meaning (tool schemas, ``tool_choice`` against ``tools``, the
model name, limits) is checked in ``admission``. A top-level field this server does not know is
refused (as the OpenAI API refuses it), never silently ignored; fields it knows but does not
implement are declared with their neutral value, and ``admission`` refuses any other value.
Messages and tools stay open: clients echo fields of earlier responses (``refusal``,
``annotations``) that change nothing. The error object answered is built as a plain dict
(``admission.error_body``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: OpenAI's rule for function names (the API answers 400 for any other name).
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Open(BaseModel):
    # Clients echo fields of earlier responses: accept and ignore them.
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class MessageToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class NamedFunction(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    # ``schema`` shadows a pydantic BaseModel attribute: stored under another name.
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    # Tool definitions stay plain JSON here: ToolSet.from_openai checks them (with jsonschema)
    # and names the broken tool in its message.
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    # ToolSpec extension: every tool strict (OpenAI sets it per tool, tools[i].function.strict).
    strict: bool = False
    # Greedy unless asked: outputs are then exactly plain decoding's (OpenAI's default is 1).
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # An extension vLLM and others accept too: 0 turns it off.
    top_k: int = Field(0, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted and without effect on the answer: bookkeeping for the caller's side.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Known, not implemented: admission refuses any value but the neutral one.
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None




class ResponsesRequest(BaseModel):
    """``POST /v1/responses``. Input items and tools stay plain JSON here: ``responses.protocol``
    reads them and names the item or tool it cannot use."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    # Greedy unless asked, as chat completions here.
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # extension, as in chat completions
    seed: int | None = None  # extension
    strict: bool = False  # ToolSpec extension: every tool strict
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    # Known, not implemented: ``responses.protocol`` refuses any value but the neutral one.
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    context_management: Any = None
