"""One admitted request's answer, whatever API asked: the replica's events read once, written
by the API's ``Reply``.

``Answer`` puts the answer together (its start, its output as content and call fragments, the
latency metrics); ``replica_events`` reads the replica's events under the request's deadline
and turns every failure into a ``RequestFailed`` (an OpenAI error object and its status);
``stream_answer`` is the one streaming loop (start, feed, finish, fail) and ``complete`` the
whole answer, run once more when its replica died before answering.

Mutates: the metrics; each ``Answer`` itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, Protocol

from fastapi.responses import JSONResponse

from deployments.http.admission import error_body
from deployments.http.chat import bodies
from deployments.http.model_client import ModelClient
from deployments.http.tool_stream import OutputDelta, ToolCallStream
from deployments.messages import (
    ChatRequest,
    ReplicaBusyError,
    ReplicaEvent,
    ReplicaUnavailableError,
    StreamEnd,
    StreamError,
    StreamStart,
    TextStep,
)
from deployments.ops import metrics
from toolspec.calls.formats import get_format

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log

RETRY_PAUSE_S = 1.0  # for Serve to learn that a replica died before the retry is routed


class RequestFailed(Exception):
    """A request that ended with an error after admission: ``status`` and the error object."""

    def __init__(self, status: int, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(body["error"]["message"])
        self.status = status
        self.body = body
        self.headers = headers or {}

    @property
    def code(self) -> str | None:
        return self.body["error"].get("code")

    def response(self, headers: dict[str, str]) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status,
                            headers={**headers, **self.headers})


def internal_error_body(request_id: str) -> dict[str, Any]:
    return error_body(f"internal error; the server's logs hold the details under request id "
                      f"{request_id}", "internal_error", code="internal_error")


def ended_early(request: ChatRequest) -> RequestFailed:
    """The replica's events stopped before its answer's end (a 503 the retry may cure)."""
    return RequestFailed(503, error_body(
        f"the model replica's answer ended early (request id {request.request_id})",
        "service_unavailable", code="replica_unavailable"))


class Answer:
    """One admitted request's answer as it is put together: its output stream, its start,
    and the timing of its fragments (for the latency metrics). Mutates: itself."""

    def __init__(self, request: ChatRequest, expose_replica: bool, arrived: float) -> None:
        self.request = request
        self.expose_replica = expose_replica
        self.start: StreamStart | None = None
        self.output: ToolCallStream | None = None
        self.mode = metrics.tool_choice_mode(len(request.tools or ()), request.tool_choice)
        self._last_fragment: float | None = None
        self.arrived = arrived
        self._tokens_since = 0  # tokens of steps that brought nothing visible yet

    def again(self, request: ChatRequest) -> Answer:
        """A fresh answer to ``request`` (a retry), timed from the same arrival."""
        return Answer(request, self.expose_replica, self.arrived)

    def started(self, start: StreamStart) -> None:
        self.start = start
        call_format = get_format(start.call_format) if self.request.parses_calls else None
        self.output = ToolCallStream(call_format, self.request.request_id[:12])

    def feed(self, step: TextStep) -> OutputDelta:
        """The step's new content and call fragments; times the first and the gaps."""
        delta = self.output.feed(step.text, step.calls)
        self._tokens_since += step.tokens
        if delta:
            now = time.perf_counter()
            if self._last_fragment is None:
                metrics.record_first_token(now - self.arrived, self.mode)
            else:
                metrics.record_inter_token(now - self._last_fragment, self._tokens_since)
            self._last_fragment, self._tokens_since = now, 0
        return delta

    def ended(self, status: int, stream: bool) -> None:
        metrics.record_request(status, self.mode, stream)
        if status == 429:
            metrics.record_refusal("queue_full")

    def extension(self, end: StreamEnd) -> dict[str, Any]:
        return bodies.extension(self.start, end, self.expose_replica)


class Reply(Protocol):
    """An API's wire shape of one answer: a streamed answer's events, each a piece of the
    response body, or the whole body (``finish``, from the chat completion)."""

    def start(self, answer: Answer) -> str:
        """The events once the replica has started (the answer's ``start`` is set)."""

    def feed(self, answer: Answer, delta: OutputDelta) -> str:
        """The events of a step's new content and call fragments (may be empty)."""

    async def finish_stream(self, answer: Answer, end: StreamEnd) -> str:
        """The closing events (held-back text, the end, usage), and whatever the answer
        leaves behind (a stored response)."""

    def fail(self, answer: Answer, error: dict[str, Any], started: bool) -> str:
        """The events that end a stream with ``error`` (``started``: ``start``'s events
        were sent)."""

    async def finish(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The whole body of an answer not streamed, from its chat completion."""


async def replica_events(client: ModelClient, request: ChatRequest
                         ) -> AsyncIterator[ReplicaEvent]:
    """The replica's events, ended by the request's deadline; errors as ``RequestFailed``."""
    stream = client.stream(request)
    try:
        while True:
            # Per event, not around the loop: a timeout must never fire while the consumer
            # holds an event (it would cancel the consumer's own awaits instead).
            remaining = None if request.deadline is None else request.deadline - time.time()
            try:
                event = await asyncio.wait_for(anext(stream), remaining)
            except StopAsyncIteration:
                return
            if isinstance(event, StreamError):
                raise _failed(request, event)
            yield event
    except TimeoutError:
        raise _failed(request, StreamError("deadline_exceeded", "")) from None
    except ReplicaBusyError as error:
        logger.warning("request %s refused: %s", request.request_id, error)
        retry = str(max(1, math.ceil(error.retry_after_s)))
        raise RequestFailed(429, error_body(
            "every model replica is busy and its queue is full; retry after "
            f"{retry} s", "rate_limit_exceeded", code="queue_full"),
            {"Retry-After": retry}) from None
    except ReplicaUnavailableError as error:
        logger.warning("request %s failed: %s", request.request_id, error)
        raise RequestFailed(503, error_body(
            f"no model replica could serve the request (request id {request.request_id})",
            "service_unavailable", code="replica_unavailable")) from None
    finally:
        await stream.aclose()  # cancels the request on the replica if it is still running


def _failed(request: ChatRequest, error: StreamError) -> RequestFailed:
    if error.kind == "context_length_exceeded":
        return RequestFailed(400, error_body(error.message, param="messages",
                                             code="context_length_exceeded"))
    if error.kind == "deadline_exceeded":
        logger.warning("request %s passed its deadline", request.request_id)
        return RequestFailed(504, error_body(
            f"the request ran past this server's time limit (request id {request.request_id})",
            "timeout", code="deadline_exceeded"))
    logger.error("request %s failed on the replica: %s", request.request_id, error.message)
    return RequestFailed(500, internal_error_body(request.request_id))


async def stream_answer(client: ModelClient, answer: Answer, reply: Reply
                        ) -> AsyncIterator[str]:
    """The streamed answer, as ``reply`` writes it. Headers are sent before the first event,
    so a failure becomes the stream's last events, never a cut stream."""
    request = answer.request
    started = False
    try:
        async for event in replica_events(client, request):
            if isinstance(event, StreamStart):
                answer.started(event)
                started = True
                yield reply.start(answer)
            elif isinstance(event, TextStep):
                events = reply.feed(answer, answer.feed(event))
                if events:
                    yield events
            elif isinstance(event, StreamEnd):
                yield await reply.finish_stream(answer, event)
                answer.ended(200, stream=True)
                return
        raise ended_early(request)
    except RequestFailed as failure:
        answer.ended(failure.status, stream=True)
        yield reply.fail(answer, failure.body, started)
    except Exception:  # a fault must not cut the stream without an error event
        logger.exception("request %s failed mid-stream", request.request_id)
        answer.ended(500, stream=True)
        yield reply.fail(answer, internal_error_body(request.request_id), started)


async def complete(client: ModelClient, answer: Answer) -> dict[str, Any]:
    """The whole answer, as a chat completion. A replica that dies before answering (a crash,
    kill -9, its node lost) costs the client nothing: the request runs once more, on another
    replica where there is one — safe, since a greedy answer is deterministic and a sampled
    one keeps its seed. The session id is dropped for the retry (its KV cache died with the
    replica, and the session's hash would pick the dead replica again)."""
    try:
        return await _complete_once(client, answer)
    except RequestFailed as failure:
        request = answer.request
        if failure.code != "replica_unavailable" or (
                request.deadline is not None and time.time() + RETRY_PAUSE_S > request.deadline):
            raise
        logger.warning("request %s: its replica failed before answering; retrying once",
                       request.request_id)
        metrics.record_retry()
    await asyncio.sleep(RETRY_PAUSE_S)
    return await _complete_once(client, answer.again(replace(answer.request, session_id=None)))


async def _complete_once(client: ModelClient, answer: Answer) -> dict[str, Any]:
    end = None
    async for event in replica_events(client, answer.request):
        if isinstance(event, StreamStart):
            answer.started(event)
        elif isinstance(event, TextStep):
            answer.feed(event)
        else:
            end = event
    if answer.start is None or end is None:
        raise ended_early(answer.request)
    answer.output.finish()
    return bodies.completion(answer.request, int(time.time()), answer.start, end,
                             answer.output, answer.extension(end))
