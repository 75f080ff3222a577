"""``POST /v1/chat/completions`` served: a body admitted into the ``ChatRequest`` it means
(``admit_chat``; also the last step of a Responses request), and its answer written as a
``chat.completion`` or as ``chat.completion.chunk`` events (``ChatReply``). Mutates nothing."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from starlette.datastructures import Headers

from deployments.http.admission import AdmissionPolicy, admit, parse_body
from deployments.http.answer import Answer
from deployments.http.chat import bodies
from deployments.http.prompting import PromptRenderer, fit_to_context
from deployments.http.schemas import ChatCompletionRequest
from deployments.http.tool_stream import OutputDelta
from deployments.messages import ChatRequest, StreamEnd

SESSION_HEADER = "x-session-id"


def admit_chat(body: ChatCompletionRequest, policy: AdmissionPolicy,
               renderer: PromptRenderer | None, request_id: str, headers: Headers,
               key_tenant: str | None) -> ChatRequest:
    """``body`` as the replicas run it: admitted (``admission.admit``), its prompt rendered
    and counted against the context (with ``renderer``), its deadline set."""
    request = admit(body, policy, request_id, headers.get(SESSION_HEADER),
                    policy.tenants.header_value(headers), key_tenant)
    if renderer is not None:
        request = fit_to_context(renderer.render(request), body, renderer.context_tokens
                                 if policy.limits.context_tokens is None
                                 else policy.limits.context_tokens)
    if policy.request_timeout_s is not None:
        request = replace(request, deadline=time.time() + policy.request_timeout_s)
    return request


def admit_raw_chat(raw: bytes, policy: AdmissionPolicy, renderer: PromptRenderer | None,
                   request_id: str, headers: Headers, key_tenant: str | None
                   ) -> tuple[ChatCompletionRequest, ChatRequest]:
    """A chat completions body, read (``admission.parse_body``) and admitted."""
    body = parse_body(raw, policy.limits)
    return body, admit_chat(body, policy, renderer, request_id, headers, key_tenant)


class ChatReply:
    """Chat completions: the completion as it is, or ``chat.completion.chunk`` events ending
    with ``[DONE]``. Mutates nothing."""

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.created = int(time.time())

    def start(self, answer: Answer) -> str:
        return bodies.chunk(answer.request, self.created, {"role": "assistant", "content": ""})

    def feed(self, answer: Answer, delta: OutputDelta) -> str:
        return "".join(bodies.chunk(answer.request, self.created, fragment)
                       for fragment in bodies.delta_bodies(delta))

    async def finish_stream(self, answer: Answer, end: StreamEnd) -> str:
        """Held-back text, the finish reason, usage if asked, ``[DONE]``."""
        request, output = answer.request, answer.output
        events = self.feed(answer, output.finish())
        events += bodies.chunk(request, self.created, {}, bodies.finish_reason(end, output),
                               toolspec=answer.extension(end))
        if self.include_usage:
            events += bodies.sse({"id": f"chatcmpl-{request.request_id}",
                                  "object": "chat.completion.chunk", "created": self.created,
                                  "model": request.model, "choices": [],
                                  "usage": bodies.usage(answer.start, end)})
        return events + bodies.DONE

    def fail(self, answer: Answer, error: dict[str, Any], started: bool) -> str:
        return bodies.sse(error) + bodies.DONE

    async def finish(self, completion: dict[str, Any]) -> dict[str, Any]:
        return completion
