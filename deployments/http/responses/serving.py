"""``POST /v1/responses`` served: a Responses body admitted as the chat request it means (the
turns it continues read from the store), and its answer written as a ``response`` object or
as the Responses stream's events, and kept when asked (``ResponseReply``).

Mutates: the response store (a kept answer).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers

from deployments.http.admission import AdmissionError, AdmissionPolicy, validate_chat
from deployments.http.answer import Answer
from deployments.http.chat import bodies
from deployments.http.chat.serving import admit_chat
from deployments.http.prompting import PromptRenderer
from deployments.http.responses.events import ResponseEvents
from deployments.http.responses.protocol import (
    ChatTurn,
    new_response_id,
    output_items,
    response_object,
    responses_param,
    stored_bytes_expected,
    to_chat,
)
from deployments.http.schemas import ResponsesRequest
from deployments.http.tool_stream import FinishedCall, OutputDelta
from deployments.messages import ChatRequest, StreamEnd
from deployments.stored_responses.service import Responses
from deployments.stored_responses.store import ResponseTooLargeError, StoredResponse

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


async def earlier_response(store: Responses | None, tenant: str, body: ResponsesRequest
                           ) -> StoredResponse | None:
    """The stored response ``previous_response_id`` names (None when it names none); a 400
    without a store, a 404 when it is not the tenant's."""
    if body.previous_response_id is None:
        return None
    if store is None:
        raise AdmissionError(400, "this server keeps no responses: send the whole "
                             "conversation as input", param="previous_response_id",
                             code="unsupported_parameter")
    earlier = await store.get(tenant, body.previous_response_id)
    if earlier is None:
        raise AdmissionError(404, f"previous response {body.previous_response_id!r} not "
                             "found", param="previous_response_id",
                             code="previous_response_not_found")
    return earlier


def admit_response(body: ResponsesRequest, earlier: StoredResponse | None,
                   policy: AdmissionPolicy, renderer: PromptRenderer | None, request_id: str,
                   headers: Headers, key_tenant: str | None, store_limit: int | None
                   ) -> tuple[ChatTurn, ChatRequest]:
    """A Responses body admitted as the chat request it means (``earlier``: the turns it
    continues); a refusal names the Responses field. ``store_limit``: the most the response
    may take in the store (None: it is not kept) — one that would not fit is refused here,
    before the model runs."""
    turn = to_chat(body, earlier)
    try:
        request = admit_chat(validate_chat(turn.document), policy, renderer, request_id,
                             headers, key_tenant)
    except AdmissionError as error:
        param = responses_param(error.param, turn)
        message = error.message.replace(error.param, param) if error.param and param \
            else error.message
        raise AdmissionError(error.status, message, param, error.code, error.kind) from None
    if store_limit is not None:
        expected = stored_bytes_expected(body, turn, request.tenant, request.max_tokens)
        if expected > store_limit:
            raise AdmissionError(400, f"this response would take about {expected} bytes in "
                                 f"the response store, which keeps at most {store_limit} per "
                                 "response: send store: false (with the whole conversation "
                                 "as input), or a shorter conversation or max_output_tokens",
                                 param="store", code="response_too_large")
    return turn, request


@dataclass(frozen=True)
class AdmittedResponse:
    """A Responses body as admitted: the body, and the chat turn it means."""

    body: ResponsesRequest
    turn: ChatTurn

    @property
    def stream(self) -> bool:
        return self.body.stream


class ResponseReply:
    """One Responses answer being written: the request read, its id and time, the stream's
    events, and the store that keeps it (None: ``store: false`` or no store). Mutates: its
    events, the store."""

    def __init__(self, admitted: AdmittedResponse, tenant: str,
                 store: Responses | None) -> None:
        self.body, self.turn, self.tenant = admitted.body, admitted.turn, tenant
        self.response_id, self.created_at = new_response_id(), int(time.time())
        self.store = store if admitted.body.store else None
        self.events = ResponseEvents(self.body, self.response_id, self.created_at)

    def start(self, answer: Answer) -> str:
        return self.events.start()

    def feed(self, answer: Answer, delta: OutputDelta) -> str:
        return self.events.feed(delta)

    async def finish_stream(self, answer: Answer, end: StreamEnd) -> str:
        tail = self.events.feed(answer.output.finish())
        incomplete = "max_output_tokens" if end.finish_reason == "length" else None
        closing, response = self.events.finish(bodies.usage(answer.start, end), incomplete,
                                               answer.extension(end))
        await self.keep(response)
        return tail + closing

    def fail(self, answer: Answer, error: dict[str, Any], started: bool) -> str:
        return ("" if started else self.events.start()) + self.events.fail(error)

    async def finish(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The ``response`` object for a finished chat completion (kept if asked)."""
        choice = completion["choices"][0]
        message = choice["message"]
        calls = [FinishedCall(call["id"], call["function"]["name"],
                              call["function"]["arguments"])
                 for call in message.get("tool_calls") or ()]
        incomplete = "max_output_tokens" if choice["finish_reason"] == "length" else None
        status = "incomplete" if incomplete else "completed"
        response = response_object(
            self.body, self.response_id, self.created_at,
            output_items(self.response_id, message.get("content") or "", calls,
                         cut=incomplete is not None),
            status, completion["usage"], incomplete, completion.get("toolspec"))
        await self.keep(response)
        return response

    async def keep(self, response: dict[str, Any]) -> None:
        """Keep ``response`` for the next turn, under its tenant, if asked. One larger than
        admission expected (its output far wordier per token than admission allows for) is
        not kept, and logged: the answer is the client's all the same."""
        if self.store is None:
            return
        try:
            await self.store.put(StoredResponse(
                self.response_id, self.tenant, float(self.created_at), self.turn.items,
                response["output"], response, self.body.user))
        except ResponseTooLargeError as error:
            logger.error("response %s not stored: %s", self.response_id, error)
