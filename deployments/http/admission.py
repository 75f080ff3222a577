"""Admission: an HTTP request body becomes a ``ChatRequest`` or an OpenAI-style error.

Everything that can be wrong with a request is found here, before it reaches a replica: the
decode loop never sees a malformed request. Every refusal is a 400-class answer whose ``param``
names the field to blame (``messages[2].tool_call_id``), as OpenAI's clients expect
(``BadRequestError``); limits are in ``deployments.http.limits``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from deployments.http.limits import (
    AdmissionLimits,
    BodyLimitError,
    check_document,
    json_depth,
    json_path,
    load_json_body,
)
from deployments.http.schemas import (
    TOOL_NAME_PATTERN,
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
)
from deployments.http.tenants import TenantError, TenantPolicy
from deployments.messages import ChatRequest
from toolspec.calls.formats import parse_arguments_json
from toolspec.calls.tool_grammar import (
    UnconstrainableToolError,
    check_answer_schema,
    check_constrainable,
)
from toolspec.calls.tools import ToolSchemaError, ToolSet

MAX_STOP_STRINGS = 4
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object every failure answers with."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class AdmissionError(Exception):
    """A request refused at admission; ``body()`` is the OpenAI error object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


@dataclass(frozen=True)
class AdmissionPolicy:
    """What the deployment serves: model ids, the default and the largest ``max_tokens``, how
    a request names its tenant, the limits, and how long a request may run."""

    models: tuple[str, ...]
    default_max_tokens: int = 256
    max_tokens_limit: int = 2048
    tenants: TenantPolicy = TenantPolicy()
    limits: AdmissionLimits = field(default_factory=AdmissionLimits)
    request_timeout_s: float | None = None
    # Responses name the replica that served them (for debugging session pinning).
    expose_replica: bool = False


def parse_body(raw: bytes, limits: AdmissionLimits = AdmissionLimits()) -> ChatCompletionRequest:
    """Raises AdmissionError (400) for a body over the limits, text that is not a JSON
    object, or a wrong shape."""
    return validate_chat(load_document(raw, limits))


def load_document(raw: bytes, limits: AdmissionLimits = AdmissionLimits()) -> dict[str, Any]:
    """The body as a JSON object, within the limits on size, nesting and text (any API's
    body); raises AdmissionError (400)."""
    try:
        document = load_json_body(raw, limits)
        if not isinstance(document, dict):
            raise AdmissionError(400, "the request body must be a JSON object",
                                 code="invalid_json")
        check_document(document, limits)
    except BodyLimitError as error:
        raise AdmissionError(400, str(error), param=error.param, code=error.code) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AdmissionError(400, f"the request body is not valid JSON: {error}",
                             code="invalid_json") from None
    return document


def validate_chat(document: dict[str, Any]) -> ChatCompletionRequest:
    """A chat-completions body's shape; raises AdmissionError (400)."""
    try:
        return ChatCompletionRequest.model_validate(document)
    except ValidationError as error:
        raise validation_error(error) from None


def validation_error(error: ValidationError) -> AdmissionError:
    """Pydantic's first complaint as a 400 naming the field (the client's names, not the
    union member pydantic tried)."""
    first = error.errors()[0]
    where = json_path(tuple(part for part in first["loc"] if not _union_tag(part)))
    if first["type"] == "extra_forbidden":
        return AdmissionError(400, f"unrecognized request argument supplied: {where}",
                              param=where, code="unknown_parameter")
    return AdmissionError(400, f"{where}: {first['msg']}", param=where, code="invalid_value")


def _union_tag(part: str | int) -> bool:
    """Pydantic names the union member it tried in an error's location (``str``,
    ``literal['auto',...]``, ``NamedToolChoice``); clients know fields, not those."""
    if isinstance(part, int):
        return False
    return not part.isidentifier() or part[0].isupper() or part in _TYPE_TAGS


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def admit(body: ChatCompletionRequest, policy: AdmissionPolicy, request_id: str,
          session_id: str | None, tenant_header: str | None = None,
          authenticated_tenant: str | None = None) -> ChatRequest:
    """The request as a replica runs it (its prompt not yet rendered: see ``api``).
    ``tenant_header``: the tenant header's value, if sent; ``authenticated_tenant``: the
    tenant of the request's API key, which decides alone when given. Raises AdmissionError
    (400 / 404)."""
    if body.model not in policy.models:
        raise AdmissionError(404, f"model {body.model!r} is not served here; available: "
                             f"{', '.join(policy.models)}", param="model",
                             code="model_not_found")
    _refuse_unsupported(body)
    limits = policy.limits
    if len(body.messages) > limits.max_messages:
        raise AdmissionError(400, f"messages holds {len(body.messages)} messages; this server "
                             f"takes at most {limits.max_messages}", param="messages",
                             code="too_many_messages")
    if body.tools is not None and len(body.tools) > limits.max_tools:
        raise AdmissionError(400, f"tools holds {len(body.tools)} tools; this server takes at "
                             f"most {limits.max_tools}", param="tools", code="too_many_tools")
    tools = _tools(body.tools, limits)
    mode, named = _tool_choice(body, tools)
    if named is not None:
        tools = ToolSet(tuple(tool for tool in tools if tool.name == named))
    max_tokens = body.max_completion_tokens or body.max_tokens or policy.default_max_tokens
    if max_tokens > policy.max_tokens_limit:
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        raise AdmissionError(400, f"{param} must be at most {policy.max_tokens_limit}, got "
                             f"{max_tokens}", param=param, code="unsupported_value")
    offered = tools if mode != "none" and tools is not None and len(tools) else None
    strict = offered is not None and (body.strict or any(tool.strict for tool in offered))
    if offered is not None and (strict or mode in ("required", "named")):
        _check_constrainable(offered)
    tenant = resolve_tenant(policy, tenant_header, body.user, authenticated_tenant)
    return ChatRequest(
        request_id=request_id,
        model=body.model,
        messages=tuple(_template_message(m, index) for index, m in enumerate(body.messages)),
        tools=offered,
        openai_tools=tuple(tool.openai() for tool in offered) if offered else (),
        tool_choice=mode,
        named_tool=named,
        strict=strict,
        parallel_tool_calls=body.parallel_tool_calls,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=_stop_strings(body.stop),
        session_id=session_id or body.user,
        tenant=tenant,
        answer_schema=_answer_schema(body.response_format),
    )


def resolve_tenant(policy: AdmissionPolicy, tenant_header: str | None, user: str | None,
                   authenticated_tenant: str | None = None) -> str:
    """Whose request it is: the API key's tenant alone when given, else the tenant header,
    else ``user`` (as the policy says); raises AdmissionError (400) for a bad name."""
    try:
        return authenticated_tenant or policy.tenants.resolve(tenant_header, user)
    except TenantError as error:
        raise AdmissionError(400, str(error), param=error.param, code="invalid_tenant") from None


def explicit_max_tokens(body: ChatCompletionRequest) -> str | None:
    """The field that set ``max_tokens``, or None when the server's default applies."""
    if body.max_completion_tokens:
        return "max_completion_tokens"
    return "max_tokens" if body.max_tokens else None


# Chat completions fields OpenAI defines that this server does not implement, with the values
# that ask for nothing (any other value is refused: the answer would silently differ from what
# was asked). The Responses API has its own (``responses.protocol``); both go through
# ``refuse_unimplemented``.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,),
    "reasoning_effort": (None,), "web_search_options": (None,),
}


def _refuse_unsupported(body: ChatCompletionRequest) -> None:
    if body.n != 1:
        raise AdmissionError(400, "only n=1 is supported", param="n", code="unsupported_value")
    if body.functions is not None or body.function_call is not None:
        param = "functions" if body.functions is not None else "function_call"
        raise AdmissionError(400, f"{param} is deprecated and not supported: use tools and "
                             "tool_choice", param=param, code="unsupported_parameter")
    refuse_unimplemented(body, _NEUTRAL)


def refuse_unimplemented(body: Any, neutral: Mapping[str, tuple[Any, ...]]) -> None:
    """A 400 naming the first field of ``neutral`` that ``body`` sets to a value other than
    the ones that ask for nothing (an object whose members are all null counts as empty,
    e.g. ``reasoning: {"effort": null}``)."""
    for name, allowed in neutral.items():
        value = getattr(body, name)
        if isinstance(value, Mapping) and not any(v is not None for v in value.values()):
            value = {}
        if not any(value == option for option in allowed):
            raise AdmissionError(400, f"{name} is not supported by this server (got "
                                 f"{json.dumps(value)[:60]})", param=name,
                                 code="unsupported_parameter")


def _tools(tools: Sequence[Mapping[str, Any]] | None, limits: AdmissionLimits) -> ToolSet | None:
    if tools is None:
        return None
    if not tools:  # OpenAI and vLLM refuse it too: leave the field out to offer no tools
        raise AdmissionError(400, "tools is an empty list; give at least one tool, or leave "
                             "tools out", param="tools", code="empty_array")
    for index, entry in enumerate(tools):
        function = entry.get("function") if isinstance(entry, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and not _TOOL_NAME.fullmatch(name):
            raise AdmissionError(400, f"tools[{index}].function.name {name[:80]!r} is not a "
                                 "valid function name: 1-64 of a-z A-Z 0-9 _ -",
                                 param=f"tools[{index}].function.name", code="invalid_value")
        size = len(json.dumps(entry, ensure_ascii=False).encode())
        if size > limits.max_tool_schema_bytes:
            raise AdmissionError(400, f"tools[{index}] is {size} bytes of JSON; this server "
                                 f"takes at most {limits.max_tool_schema_bytes} per tool",
                                 param=f"tools[{index}]", code="tool_schema_too_large")
        if json_depth(entry) > limits.max_tool_schema_depth:
            raise AdmissionError(400, f"tools[{index}] nests JSON {json_depth(entry)} levels "
                                 f"deep; this server takes at most "
                                 f"{limits.max_tool_schema_depth}",
                                 param=f"tools[{index}]", code="tool_schema_too_deep")
    try:
        return ToolSet.from_openai(tools)
    except ToolSchemaError as error:
        raise AdmissionError(400, str(error), param="tools", code="invalid_tool_schema") from None


def _tool_choice(body: ChatCompletionRequest, tools: ToolSet | None) -> tuple[str, str | None]:
    choice = body.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), None
    if tools is None and choice != "none":
        raise AdmissionError(400, "tool_choice is only allowed when tools are specified",
                             param="tool_choice", code="invalid_tool_choice")
    if isinstance(choice, NamedToolChoice):
        if tools.get(choice.function.name) is None:
            raise AdmissionError(400, f"tool_choice names {choice.function.name!r}, which is not "
                                 f"among the tools (offered: {', '.join(tools.names)})",
                                 param="tool_choice", code="invalid_tool_choice")
        return "named", choice.function.name
    return choice, None


def _check_constrainable(tools: ToolSet) -> None:
    """Constrained decoding (``required``, named, ``strict``) needs schemas it can enforce."""
    try:
        check_constrainable(tools.tools)
    except UnconstrainableToolError as error:
        raise AdmissionError(400, str(error), param="tools",
                             code="unsupported_tool_schema") from None


def _answer_schema(response_format: ResponseFormat | None) -> Mapping[str, Any] | None:
    """The JSON schema ``response_format`` asks the answer to follow (None: free text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return {"type": "object"}
    if response_format.json_schema is None:
        raise AdmissionError(400, "response_format of type json_schema needs a json_schema "
                             "object", param="response_format.json_schema",
                             code="missing_required_parameter")
    schema = response_format.json_schema.json_schema or {"type": "object"}
    try:
        check_answer_schema(schema)
    except UnconstrainableToolError as error:
        raise AdmissionError(400, str(error), param="response_format.json_schema.schema",
                             code="unsupported_schema") from None
    return schema


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else list(stop or ())
    if len(strings) > MAX_STOP_STRINGS or any(not s for s in strings):
        raise AdmissionError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings",
                             param="stop", code="invalid_value")
    return tuple(strings)


def _template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """A message as chat templates expect it: text content, call arguments as objects."""
    where = f"messages[{index}]"
    if message.role == "tool" and not message.tool_call_id:
        raise AdmissionError(400, f"{where}: a message with role 'tool' needs the "
                             "tool_call_id of the call it answers",
                             param=f"{where}.tool_call_id", code="missing_required_parameter")
    content = message.content
    if isinstance(content, list):
        content = "".join(_text_part(part, f"{where}.content[{number}]")
                          for number, part in enumerate(content))
    entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                             "content": content or ""}
    if message.name:
        entry["name"] = message.name
    if message.tool_call_id:
        entry["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        entry["tool_calls"] = [_history_call(call, f"{where}.tool_calls[{number}]")
                               for number, call in enumerate(message.tool_calls)]
    return entry


def _text_part(part: Mapping[str, Any], where: str) -> str:
    if part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise AdmissionError(400, f"{where}: only text content parts are supported (got type "
                             f"{str(part.get('type'))[:40]!r})", param=where,
                             code="unsupported_content")
    return part["text"]


def _history_call(call: Any, where: str) -> dict[str, Any]:
    """An earlier assistant call, its arguments as an object (``""``: a call without
    arguments, as some clients send it)."""
    arguments = call.function.arguments
    try:
        parsed = {} if isinstance(arguments, str) and not arguments.strip() \
            else dict(parse_arguments_json(arguments))
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise AdmissionError(400, f"{where}.function.arguments is not a JSON object: {error}",
                             param=f"{where}.function.arguments", code="invalid_value") from None
    return {"type": "function", "id": call.id,
            "function": {"name": call.function.name, "arguments": parsed}}
