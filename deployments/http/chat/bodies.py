"""OpenAI response bodies: ``chat.completion``, ``chat.completion.chunk`` and SSE framing.

The ``toolspec`` extension object reports what speculation did for the request: mean tokens
per verification step (MAT), accepted draft tokens per draft source, and the step count; and
whether decoding was grammar-constrained (``constrained``).
"""

from __future__ import annotations

import json
from typing import Any

from deployments.http.tool_stream import OutputDelta, ToolCallStream
from deployments.messages import ChatRequest, StreamEnd, StreamStart

DONE = "data: [DONE]\n\n"


def finish_reason(end: StreamEnd, output: ToolCallStream) -> str:
    if end.finish_reason == "length":
        return "length"
    return "tool_calls" if output.tool_calls else "stop"


def usage(start: StreamStart, end: StreamEnd) -> dict[str, Any]:
    """Token counts; ``cached_tokens``: prompt tokens whose keys and values the replica's
    prefix cache held (earlier requests of the tenant computed them; not computed again)."""
    return {"prompt_tokens": start.prompt_tokens, "completion_tokens": end.completion_tokens,
            "total_tokens": start.prompt_tokens + end.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": end.cached_tokens}}


def extension(start: StreamStart, end: StreamEnd, expose_replica: bool = False
              ) -> dict[str, Any]:
    """The ``toolspec`` object; it names the replica only when the deployment says so."""
    body = {"mat": round(end.mat, 4), "steps": end.steps,
            "accepted_by_source": dict(end.accepted_by_source),
            "prefill_s": round(end.prefill_s, 4), "decode_s": round(end.decode_s, 4),
            "call_format": start.call_format,
            "cached_tokens": end.cached_tokens, "constrained": start.constrained,
            # Forward rows the request cost: prompt rows computed (not cached), decoding rows.
            "rows": {"prompt": start.prompt_tokens - end.cached_tokens,
                     "decode": end.decode_rows}}
    if expose_replica:
        body["replica"] = start.replica
    return body


def completion(request: ChatRequest, created: int, start: StreamStart, end: StreamEnd,
               output: ToolCallStream, toolspec: dict[str, Any]) -> dict[str, Any]:
    """The whole ``chat.completion`` for a finished (and ``finish``-ed) ``output``;
    ``toolspec``: the extension object."""
    message: dict[str, Any] = {"role": "assistant", "content": output.content}
    calls = output.tool_calls
    if calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}} for call in calls]
    return {
        "id": f"chatcmpl-{request.request_id}", "object": "chat.completion", "created": created,
        "model": request.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason(end, output)}],
        "usage": usage(start, end),
        "toolspec": toolspec,
    }


def chunk(request: ChatRequest, created: int, delta: dict[str, Any],
          finish: str | None = None, **extra: Any) -> str:
    """One SSE event holding a ``chat.completion.chunk``."""
    body = {"id": f"chatcmpl-{request.request_id}", "object": "chat.completion.chunk",
            "created": created, "model": request.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **extra}
    return sse(body)


def delta_bodies(delta: OutputDelta) -> list[dict[str, Any]]:
    """An ``OutputDelta`` as the ``delta`` bodies of successive chunks: its content, then one
    chunk per tool-call fragment (a step may finish one call and start the next; several
    clients read only the first fragment of a chunk)."""
    bodies: list[dict[str, Any]] = [{"content": delta.content}] if delta.content else []
    for call in delta.tool_calls:
        function: dict[str, Any] = {"arguments": call.arguments}
        fragment: dict[str, Any] = {"index": call.index, "function": function}
        if call.name is not None:
            fragment["id"] = call.id
            fragment["type"] = "function"
            function["name"] = call.name
        bodies.append({"tool_calls": [fragment]})
    return bodies


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
