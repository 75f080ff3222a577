"""Admission: an HTTP request body becomes a ``ChatRequest`` or an OpenAI-style error.

Everything that can be wrong with a request is found here, before it reaches a replica: the
decode loop never sees a malformed request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.messages import ChatRequest
from deployments.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from deployments.tenants import TenantError, TenantPolicy
from toolspec.formats import parse_arguments_json
from toolspec.tool_grammar import UnconstrainableToolError, check_constrainable
from toolspec.tools import ToolSchemaError, ToolSet

MAX_STOP_STRINGS = 4


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
    """What the deployment serves: model ids, the default and the largest ``max_tokens``, and
    how a request names its tenant."""

    models: tuple[str, ...]
    default_max_tokens: int = 256
    max_tokens_limit: int = 2048
    tenants: TenantPolicy = TenantPolicy()


def parse_body(raw: bytes) -> ChatCompletionRequest:
    """Raises AdmissionError: 400 for text that is not a JSON object, 422 for a wrong shape."""
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AdmissionError(400, f"the request body is not valid JSON: {error}",
                             code="invalid_json") from None
    if not isinstance(document, dict):
        raise AdmissionError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return ChatCompletionRequest.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if not _union_tag(part))
        raise AdmissionError(422, f"{where}: {first['msg']}", param=where,
                             code="invalid_value") from None


def _union_tag(part: str | int) -> bool:
    """Pydantic names the union member it tried in an error's location (``str``,
    ``literal['auto',...]``, ``NamedToolChoice``); clients know fields, not those."""
    if isinstance(part, int):
        return False
    return not part.isidentifier() or part[0].isupper() or part in _TYPE_TAGS


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def admit(body: ChatCompletionRequest, policy: AdmissionPolicy, request_id: str,
          session_id: str | None, tenant_header: str | None = None) -> ChatRequest:
    """The request as a replica runs it. ``tenant_header``: the tenant header's value, if
    sent. Raises AdmissionError (400 / 404)."""
    if body.model not in policy.models:
        raise AdmissionError(404, f"model {body.model!r} is not served here; available: "
                             f"{', '.join(policy.models)}", param="model",
                             code="model_not_found")
    if body.n != 1:
        raise AdmissionError(400, "only n=1 is supported", param="n", code="unsupported_value")
    tools = _tools(body.tools)
    mode, named = _tool_choice(body, tools)
    if named is not None:
        tools = ToolSet(tuple(tool for tool in tools if tool.name == named))
    max_tokens = body.max_completion_tokens or body.max_tokens or policy.default_max_tokens
    if max_tokens > policy.max_tokens_limit:
        raise AdmissionError(400, f"max_tokens must be at most {policy.max_tokens_limit}, got "
                             f"{max_tokens}", param="max_tokens", code="unsupported_value")
    offered = tools if mode != "none" and tools is not None and len(tools) else None
    strict = offered is not None and (body.strict or any(tool.strict for tool in offered))
    if offered is not None and (strict or mode in ("required", "named")):
        _check_constrainable(offered)
    try:
        tenant = policy.tenants.resolve(tenant_header, body.user)
    except TenantError as error:
        raise AdmissionError(400, str(error), param=error.param, code="invalid_tenant") from None
    return ChatRequest(
        request_id=request_id,
        model=body.model,
        messages=tuple(_template_message(m) for m in body.messages),
        tools=offered,
        openai_tools=tuple(tool.openai() for tool in offered) if offered else (),
        tool_choice=mode,
        named_tool=named,
        strict=strict,
        parallel_tool_calls=body.parallel_tool_calls,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=_stop_strings(body.stop),
        session_id=session_id or body.user,
        tenant=tenant,
    )


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> ToolSet | None:
    if not tools:
        return None
    try:
        return ToolSet.from_openai(tools)
    except ToolSchemaError as error:
        raise AdmissionError(400, str(error), param="tools", code="invalid_tool_schema") from None


def _tool_choice(body: ChatCompletionRequest, tools: ToolSet | None) -> tuple[str, str | None]:
    choice = body.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, NamedToolChoice):
        if tools is None or tools.get(choice.function.name) is None:
            offered = ", ".join(tools.names) if tools else "none"
            raise AdmissionError(400, f"tool_choice names {choice.function.name!r}, which is not "
                                 f"among the tools (offered: {offered})", param="tool_choice",
                                 code="invalid_tool_choice")
        return "named", choice.function.name
    if choice == "required" and tools is None:
        raise AdmissionError(400, "tool_choice 'required' needs at least one tool in 'tools'",
                             param="tool_choice", code="invalid_tool_choice")
    return choice, None


def _check_constrainable(tools: ToolSet) -> None:
    """Constrained decoding (``required``, named, ``strict``) needs schemas it can enforce."""
    try:
        check_constrainable(tools.tools)
    except UnconstrainableToolError as error:
        raise AdmissionError(400, str(error), param="tools",
                             code="unsupported_tool_schema") from None


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else list(stop or ())
    if len(strings) > MAX_STOP_STRINGS or any(not s for s in strings):
        raise AdmissionError(400, f"stop takes at most {MAX_STOP_STRINGS} non-empty strings",
                             param="stop", code="invalid_value")
    return tuple(strings)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates expect it: text content, call arguments as objects."""
    content = message.content
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content
                          if part.get("type") == "text")
    entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                             "content": content or ""}
    if message.name:
        entry["name"] = message.name
    if message.tool_call_id:
        entry["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        try:
            entry["tool_calls"] = [
                {"type": "function", "id": call.id, "function": {
                    "name": call.function.name,
                    "arguments": dict(parse_arguments_json(call.function.arguments))}}
                for call in message.tool_calls]
        except (json.JSONDecodeError, TypeError, ValueError) as error:
            raise AdmissionError(400, f"an assistant tool call's arguments are not a JSON object:"
                                 f" {error}", param="messages", code="invalid_value") from None
    return entry
