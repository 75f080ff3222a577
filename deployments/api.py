"""The OpenAI-compatible HTTP API, as a FastAPI app over any ``ModelClient``.

``create_api`` is what the Serve ingress mounts; tests mount it over a client backed by a fake
engine. Every failure answers with an OpenAI error object: 400/422 for a bad request, 404 for
an unknown model, 503 when no replica can serve — never a bare 500 or a hang.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments import responses
from deployments.admission import AdmissionError, AdmissionPolicy, admit, error_body, parse_body
from deployments.messages import (ChatRequest, ReplicaEvent, ReplicaUnavailableError, StreamEnd,
                                  StreamStart, TextStep)
from deployments.tool_stream import ToolCallStream
from deployments.tracing import tracer
from toolspec.formats import get_format

SESSION_HEADER = "x-session-id"
logger = logging.getLogger(__name__)


class ModelClient(Protocol):
    """Reaches a model replica; the session id (if any) picks which one."""

    def stream(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        """The replica's events for ``request``; raises ReplicaUnavailableError."""


class IncompleteStreamError(ReplicaUnavailableError):
    """The replica's events ended without a StreamEnd."""


def create_api(client: ModelClient, policy: AdmissionPolicy) -> FastAPI:
    """The app: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``."""
    api = FastAPI(title="ToolSpec serving", docs_url=None, redoc_url=None)

    @api.exception_handler(AdmissionError)
    async def refused(_: Request, error: AdmissionError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and wrong methods, in the OpenAI error shape too.
        return JSONResponse(error_body(str(error.detail)), status_code=error.status_code)

    @api.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected failure")
        return JSONResponse(error_body(f"internal error: {type(error).__name__}: {error}",
                                       "internal_error", code="internal_error"), status_code=500)

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "toolspec"}
            for name in policy.models]}

    @api.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Any:
        with tracer.start_as_current_span("toolspec.request") as span:
            with tracer.start_as_current_span("toolspec.admission"):
                body = parse_body(await http.body())
                request = admit(body, policy, uuid.uuid4().hex[:24],
                                http.headers.get(SESSION_HEADER),
                                policy.tenants.header_value(http.headers))
            span.set_attributes({"toolspec.request_id": request.request_id,
                                 "toolspec.stream": body.stream,
                                 "toolspec.tools": len(request.tools or ())})
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            if body.stream:
                # The stream outlives this span; its replica call is traced on its own.
                return StreamingResponse(_stream(client, request, include_usage),
                                         media_type="text/event-stream")
            return await _complete(client, request)

    return api


async def _complete(client: ModelClient, request: ChatRequest) -> Any:
    start, end, output = None, None, None
    try:
        async for event in client.stream(request):
            if isinstance(event, StreamStart):
                start, output = event, _output_for(request, event)
            elif isinstance(event, TextStep):
                output.feed(event.text)
            else:
                end = event
    except ReplicaUnavailableError as error:
        return _unavailable(error)
    if start is None or end is None:
        return _unavailable(IncompleteStreamError("the replica's answer ended early"))
    output.finish()
    return responses.completion(request, int(time.time()), start, end, output)


async def _stream(client: ModelClient, request: ChatRequest, include_usage: bool
                  ) -> AsyncIterator[str]:
    created = int(time.time())
    start, output = None, None
    try:
        async for event in client.stream(request):
            if isinstance(event, StreamStart):
                start, output = event, _output_for(request, event)
                yield responses.chunk(request, created, {"role": "assistant", "content": ""})
            elif isinstance(event, TextStep):
                delta = output.feed(event.text)
                if delta:
                    yield responses.chunk(request, created, responses.delta_body(delta))
            elif isinstance(event, StreamEnd):
                yield _final_chunks(request, created, start, event, output, include_usage)
                yield responses.DONE
                return
        raise IncompleteStreamError("the replica's answer ended early")
    except ReplicaUnavailableError as error:
        # Headers are sent already: the error goes in the stream, then the stream ends.
        logger.warning("request %s failed mid-stream: %s", request.request_id, error)
        yield responses.sse(_error_body(error))
        yield responses.DONE
    except Exception as error:  # a fault must not cut the stream without an error event
        logger.exception("request %s failed mid-stream", request.request_id)
        yield responses.sse(error_body(f"internal error: {type(error).__name__}: {error}",
                                       "internal_error", code="internal_error"))
        yield responses.DONE


def _final_chunks(request: ChatRequest, created: int, start: StreamStart, end: StreamEnd,
             output: ToolCallStream, include_usage: bool) -> str:
    """The last chunks: held-back text, the finish reason, and usage if asked."""
    events = ""
    rest = output.finish()
    if rest:
        events += responses.chunk(request, created, responses.delta_body(rest))
    events += responses.chunk(request, created, {}, responses.finish_reason(end, output),
                              toolspec=responses.extension(start, end))
    if include_usage:
        events += responses.sse({"id": f"chatcmpl-{request.request_id}",
                                 "object": "chat.completion.chunk", "created": created,
                                 "model": request.model, "choices": [],
                                 "usage": responses.usage(start, end)})
    return events


def _output_for(request: ChatRequest, start: StreamStart) -> ToolCallStream:
    call_format = get_format(start.call_format) if request.parses_calls else None
    return ToolCallStream(call_format, request.request_id[:12])


def _error_body(error: ReplicaUnavailableError) -> dict[str, Any]:
    return error_body(f"no model replica could serve the request: {error}",
                      "service_unavailable", code="replica_unavailable")


def _unavailable(error: ReplicaUnavailableError) -> JSONResponse:
    logger.warning("request failed: %s", error)
    return JSONResponse(_error_body(error), status_code=503)
