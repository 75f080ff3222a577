"""The Responses API's protocol (``POST /v1/responses``) over the one chat engine path.

A Responses request is read (``parse_request``: its shape), turned into the chat-completions
request it means (``to_chat``: input items → messages, Responses tools → chat tools,
``text.format`` → ``response_format``, ``max_output_tokens`` → ``max_completion_tokens``),
admitted and run exactly as a chat completion is — same limits, tenants, metrics, speculation —
and its answer written back as a ``response`` object (``response_object``) or as the Responses
stream's events (``deployments.http.responses.events``). A refusal names the Responses field it
is about (``responses_param`` maps the chat field admission named back to it).

Nothing here mutates anything.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.http.admission import (
    AdmissionError,
    load_document,
    refuse_unimplemented,
    validation_error,
)
from deployments.http.schemas import ResponsesRequest
from deployments.http.tool_stream import FinishedCall
from deployments.stored_responses.store import StoredResponse, encoded

RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9]{8,64}")
# What a stored response's answer adds, expected at most, per output token: its text is kept
# twice (the output items, and the response object's), ~4 bytes a token each, JSON-escaped;
# and once per answer: usage, the toolspec extension, item ids and statuses.
_STORED_BYTES_PER_OUTPUT_TOKEN = 32
_STORED_BYTES_PER_ANSWER = 4096
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# Known fields this server does not implement, with the values that ask for nothing.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "reasoning": (None, {}), "include": (None, []), "truncation": (None, "disabled"),
    "background": (None, False), "max_tool_calls": (None,), "top_logprobs": (None, 0),
    "prompt": (None,), "conversation": (None,), "context_management": (None,),
}


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def parse_request(raw: bytes, limits: Any) -> ResponsesRequest:
    """The body's shape; raises AdmissionError (400, ``param`` the Responses field)."""
    document = load_document(raw, limits)
    try:
        body = ResponsesRequest.model_validate(document)
    except ValidationError as error:
        raise validation_error(error) from None
    refuse_unimplemented(body, _NEUTRAL)
    if body.previous_response_id is not None and \
            not RESPONSE_ID.fullmatch(body.previous_response_id):
        raise AdmissionError(404, f"previous response {body.previous_response_id[:80]!r} not "
                             "found", param="previous_response_id",
                             code="previous_response_not_found")
    return body


@dataclass(frozen=True)
class ChatTurn:
    """A Responses request as the chat request it means. ``items``: the conversation this turn
    sees (the earlier turns' items, then its input, normalised), what a stored response keeps;
    ``origins``: per chat message, the Responses field it came from."""

    document: dict[str, Any]
    items: list[dict[str, Any]]
    origins: list[str]


def to_chat(body: ResponsesRequest, earlier: StoredResponse | None) -> ChatTurn:
    """Raises AdmissionError (400) naming the Responses field that cannot be read."""
    given = _input_items(body.input)
    items = [*(earlier.conversation if earlier is not None else []), *given]
    first_given = len(items) - len(given)
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    if body.instructions:  # never carried over from an earlier response (as OpenAI does)
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    for index, item in enumerate(items):
        where = (f"input[{index - first_given}]" if isinstance(body.input, list) else "input") \
            if index >= first_given else "previous_response_id"
        _add_item(item, where, messages, origins)
    if not messages:
        raise AdmissionError(400, "input holds no message", param="input", code="invalid_value")
    document: dict[str, Any] = {
        "model": body.model, "messages": messages,
        "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature,
        "top_p": body.top_p, "top_k": body.top_k, "strict": body.strict}
    optional = {"max_completion_tokens": body.max_output_tokens, "seed": body.seed,
                "user": body.user, "metadata": body.metadata,
                # No tools is no tools here (the Responses API takes an empty list, unlike
                # chat completions): the chat request then has none.
                "tools": _tools(body.tools) if body.tools else None,
                "tool_choice": _tool_choice(body.tool_choice),
                "response_format": _response_format(body.text)}
    document.update({key: value for key, value in optional.items() if value is not None})
    return ChatTurn(document, items, origins)


def stored_bytes_expected(body: ResponsesRequest, turn: ChatTurn, tenant: str,
                          max_tokens: int) -> int:
    """What keeping this turn's response will take in the store, expected at most: the
    conversation and the response object, exactly; its answer, allowed for by its
    ``max_tokens``."""
    response_id = new_response_id()
    shell = response_object(body, response_id, 0, [], "completed", None)
    known = encoded(StoredResponse(response_id, tenant, 0.0, turn.items, [], shell, body.user))
    return len(tenant) + len(response_id) + 1 + len(known) + \
        _STORED_BYTES_PER_ANSWER + _STORED_BYTES_PER_OUTPUT_TOKEN * max_tokens


def responses_param(param: str | None, turn: ChatTurn | None) -> str | None:
    """The Responses field a chat field named by admission came from."""
    if param is None:
        return None
    found = re.fullmatch(r"messages\[(\d+)\](.*)", param)
    if found and turn is not None and int(found[1]) < len(turn.origins):
        rest = found[2]
        rest = re.sub(r"^\.tool_calls\[\d+\]\.function\.arguments$", ".arguments", rest)
        rest = re.sub(r"^\.tool_call_id$", ".call_id", rest)
        rest = re.sub(r"^\.content.*$", ".content", rest)
        origin = turn.origins[int(found[1])]
        return origin if origin in ("instructions", "previous_response_id") else origin + rest
    if param == "messages":
        return "input"
    param = re.sub(r"^tools\[(\d+)\]\.function\.", r"tools[\1].", param)
    param = re.sub(r"^tool_choice\.function\.name$", "tool_choice.name", param)
    param = re.sub(r"^response_format\.json_schema", "text.format", param)
    param = re.sub(r"^response_format", "text.format", param)
    return {"max_completion_tokens": "max_output_tokens",
            "max_tokens": "max_output_tokens"}.get(param, param)


# ---- the answer ---------------------------------------------------------------------------

def output_items(response_id: str, content: str, calls: Sequence[FinishedCall],
                 cut: bool = False) -> list[dict[str, Any]]:
    """A finished answer as output items: its text as one message, then one ``function_call``
    item per call (``call_id`` is the id the next turn's ``function_call_output`` names).
    ``cut``: the answer stopped at ``max_output_tokens``, inside its last item, which is
    ``incomplete`` (as the stream closes it); the items before it are ``completed``."""
    items = [message_item(response_id, content, "completed")] if content else []
    items += [function_call_item(response_id, index, call, "completed")
              for index, call in enumerate(calls)]
    if cut and items:
        items[-1]["status"] = "incomplete"
    return items


def message_item(response_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [output_text_part(text)]
    return {"type": "message", "id": f"msg_{response_id[5:]}", "status": status,
            "role": "assistant", "content": content}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def function_call_item(response_id: str, index: int, call: FinishedCall, status: str
                       ) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{response_id[5:]}_{index}",
            "call_id": call.id, "name": call.name, "arguments": call.arguments,
            "status": status}


def response_object(body: ResponsesRequest, response_id: str, created_at: int,
                    output: list[dict[str, Any]], status: str,
                    usage: Mapping[str, Any] | None, incomplete: str | None = None,
                    toolspec: Mapping[str, Any] | None = None,
                    error: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object; ``usage`` from the chat answer's (prompt → input)."""
    answer: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "error": dict(error) if error else None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "model": body.model, "output": output, "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id, "reasoning": None,
        "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
        "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [], "truncation": "disabled", "user": body.user,
        "metadata": body.metadata or {},
        "usage": _usage(usage) if usage is not None else None}
    if toolspec is not None:
        answer["toolspec"] = dict(toolspec)
    return answer


def _usage(chat: Mapping[str, Any]) -> dict[str, Any]:
    cached = (chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"]}


# ---- reading the request ------------------------------------------------------------------

def _input_items(given: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(given, str):
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": given}]}]
    items = []
    for index, item in enumerate(given):
        if not isinstance(item, Mapping):
            raise AdmissionError(400, f"input[{index}] must be an object", param=f"input[{index}]",
                                 code="invalid_type")
        items.append({"type": "message", **item} if "type" not in item else dict(item))
    return items


def _add_item(item: Mapping[str, Any], where: str, messages: list[dict[str, Any]],
              origins: list[str]) -> None:
    kind = item.get("type")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise AdmissionError(400, f"{where}.role must be user, system, developer or "
                                 f"assistant, got {json.dumps(role)[:40]}",
                                 param=f"{where}.role", code="invalid_value")
        messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        origins.append(where)
    elif kind == "function_call":
        call = {"id": _string(item, "call_id", where), "type": "function", "function": {
            "name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and origins[-1] != "instructions":
            last.setdefault("tool_calls", []).append(call)  # the calls of one turn, together
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            origins.append(where)
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                         "content": _text(output, f"{where}.output")})
        origins.append(where)
    else:
        raise AdmissionError(400, f"{where}.type {json.dumps(kind)[:40]} is not supported by "
                             "this server: message, function_call and function_call_output are",
                             param=f"{where}.type", code="unsupported_value")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise AdmissionError(400, f"{where} must be a string or a list of text parts",
                             param=where, code="invalid_type")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") not in _TEXT_PARTS \
                or not isinstance(part.get("text"), str):
            raise AdmissionError(400, f"{where}[{index}] is not a text part (input_text or "
                                 "output_text with a string text): this server reads text only",
                                 param=f"{where}[{index}]", code="unsupported_value")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str) or not value and field != "arguments":
        raise AdmissionError(400, f"{where}.{field} must be a non-empty string",
                             param=f"{where}.{field}", code="invalid_value")
    return value


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    chat = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise AdmissionError(400, f"tools[{index}].type {json.dumps(kind)[:40]} is not "
                                 "supported by this server: function tools are",
                                 param=f"tools[{index}].type", code="unsupported_value")
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                    if tool.get(key) is not None}
        chat.append({"type": "function", "function": function})
    return chat


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise AdmissionError(400, "tool_choice must be auto, none, required or {\"type\": "
                         "\"function\", \"name\": ...}", param="tool_choice",
                         code="unsupported_value")


def _response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, Mapping):
        raise AdmissionError(400, "text.format must be an object", param="text.format",
                             code="invalid_type")
    if form.get("type") == "text":
        return None
    if form.get("type") == "json_schema":
        schema = {key: form[key] for key in ("name", "description", "schema", "strict")
                  if form.get(key) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": form.get("type")}  # json_object, or a type the chat schema refuses
