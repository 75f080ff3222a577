"""The OpenAI-compatible HTTP API, as a FastAPI app over any ``ModelClient``.

``create_api`` is what the Serve ingress mounts; tests mount it over a client backed by a fake
engine. Every failure answers with an OpenAI error object: 400 for a bad request (``param``
names the field), 404 for an unknown model, 429 with ``Retry-After`` when the replicas' queue
is full, 504 past the request's deadline, 503 when no replica (or the response store) can
serve — never a bare 500, a hang, or a stalled replica. A 5xx names the request id (the logs
hold the details under it), never an exception's text. ``/health`` answers with
``deployments.http.health``'s report, which also keeps the model description ``/v1/models``
shows. Mutates: per request, ``http.state`` (its id) and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.http import chat_bodies
from deployments.http.admission import (
    AdmissionError,
    AdmissionPolicy,
    admit,
    error_body,
    parse_body,
    resolve_tenant,
    validate_chat,
)
from deployments.http.auth import ApiKeys
from deployments.http.health import LoadedModel, health_report
from deployments.http.model_client import ModelClient
from deployments.http.prompting import PromptRenderer, fit_to_context
from deployments.http.responses_api import (
    RESPONSE_ID,
    ChatTurn,
    ResponseEvents,
    new_response_id,
    output_items,
    parse_request,
    response_object,
    responses_param,
    stored_bytes_expected,
    to_chat,
)
from deployments.http.schemas import ChatCompletionRequest, ResponsesRequest
from deployments.http.tool_stream import FinishedCall, OutputDelta, ToolCallStream
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
from deployments.ops.tracing import tracer
from deployments.stored_responses.service import Responses, ResponseStoreUnavailableError
from deployments.stored_responses.store import ResponseTooLargeError, StoredResponse
from toolspec.calls.formats import get_format

SESSION_HEADER = "x-session-id"
REQUEST_ID_HEADER = "x-request-id"
logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


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


def create_api(client: ModelClient, policy: AdmissionPolicy,
               renderer: PromptRenderer | None = None, keys: ApiKeys | None = None,
               store: Responses | None = None) -> FastAPI:
    """The app: ``POST /v1/chat/completions``, ``POST /v1/responses`` (with ``GET`` and
    ``DELETE /v1/responses/{id}``), ``GET /v1/models``, ``GET /health``.

    ``renderer``: the served model's chat template and tokenizer, to count a prompt's tokens
    at admission (None: the replica counts them, and refuses a prompt too long with a 400).
    ``keys``: the API keys ``/v1/*`` requires, each naming its tenant (None: open, the tenant
    header trusted). ``store``: where ``store: true`` responses are kept for
    ``previous_response_id`` (None: none are kept): one store every ingress replica reaches
    (``deployments.stored_responses.service``)."""
    api = FastAPI(title="ToolSpec serving", docs_url=None, redoc_url=None)

    @api.exception_handler(AdmissionError)
    async def refused(http: Request, error: AdmissionError) -> JSONResponse:
        metrics.record_refusal(error.code or error.param or "invalid_request")
        metrics.record_request(error.status, "unknown", False)
        headers = _id_header(http)
        if error.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @api.exception_handler(ResponseStoreUnavailableError)
    async def store_unavailable(http: Request, error: ResponseStoreUnavailableError
                                ) -> JSONResponse:
        request_id = getattr(http.state, "request_id", None) or "-"
        logger.warning("request %s: the response store is unreachable: %s", request_id, error)
        metrics.record_request(503, "unknown", False)
        return JSONResponse(error_body(
            f"the response store is unavailable; retry later (request id {request_id})",
            "service_unavailable", code="response_store_unavailable"), status_code=503,
            headers=_id_header(http))

    def tenant_of_key(http: Request) -> str | None:
        """The tenant of the request's API key (None without keys); raises a 401."""
        return keys.tenant(http.headers.get("authorization")) if keys is not None else None

    @api.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and wrong methods, in the OpenAI error shape too.
        return JSONResponse(error_body(str(error.detail)), status_code=error.status_code)

    @api.exception_handler(Exception)
    async def internal_error(http: Request, error: Exception) -> JSONResponse:
        request_id = getattr(http.state, "request_id", None) or "-"
        logger.exception("request %s: unexpected failure", request_id)
        metrics.record_request(500, "unknown", False)
        return JSONResponse(internal_error_body(request_id), status_code=500,
                            headers=_id_header(http))

    loaded = LoadedModel(client)  # the replicas' description, for /health and /v1/models

    @api.get("/health")
    async def health() -> JSONResponse:
        report = await health_report(client, loaded)
        return JSONResponse(report, status_code=200 if report["status"] != "unavailable"
                            else 503)

    @api.get("/v1/models")
    async def models(http: Request) -> dict[str, Any]:
        tenant_of_key(http)
        described = await loaded.get()
        extra = {} if described is None else {
            "root": described.get("model"), "max_model_len": described.get("context_tokens"),
            "dtype": described.get("dtype"), "engine": described.get("engine"),
            # How the replicas run it: ranks per replica, and bitwise plain decoding in bf16.
            "tensor_parallel_size": described.get("tensor_parallel_size", 1),
            "exact_bf16": described.get("exact_bf16", False),
            # Rows a forward runs at most, and the prefix cache's block size and memory.
            "step_rows": described.get("step_rows"),
            "prefix_cache": {key: value for key, value in
                             (described.get("prefix_cache") or {}).items()
                             if key in ("block_tokens", "budget_bytes")} or None}
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "toolspec", **extra}
            for name in policy.models]}

    async def serve_request(http: Request,
                            admit: Callable[..., Awaitable[tuple[Any, ChatRequest]]],
                            reply: Callable[[Any, _Answer], _Reply]) -> Any:
        """One request on the one engine path, whatever its wire shape: ``admit`` reads the
        body (its CPU work off the event loop: parsing and rendering), ``reply`` writes the
        answer in the API's shape."""
        arrived = time.perf_counter()
        request_id = _request_id(http)
        tenant = tenant_of_key(http)  # before reading a body an unknown caller sent
        with tracer.start_as_current_span("toolspec.request") as span:
            raw = await _read_body(http, policy.limits.max_body_bytes)
            with tracer.start_as_current_span("toolspec.admission"):
                body, request = await admit(raw, request_id, http, tenant)
            span.set_attributes({"toolspec.request_id": request_id,
                                 "toolspec.stream": body.stream,
                                 "toolspec.tools": len(request.tools or ())})
            answer = _Answer(request, policy.expose_replica, arrived)
            shape = reply(body, answer)
            if body.stream:
                # The stream outlives this span; its replica call is traced on its own.
                return StreamingResponse(shape.stream(client, answer),
                                         media_type="text/event-stream",
                                         headers=_id_header(http))
            try:
                result = await _complete(client, answer)
            except RequestFailed as failure:
                answer.ended(failure.status, stream=False)
                return failure.response(_id_header(http))
            answer.ended(200, stream=False)
            return JSONResponse(await shape.finish(result), headers=_id_header(http))

    @api.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Any:
        async def admit(raw: bytes, request_id: str, http: Request, tenant: str | None
                        ) -> tuple[ChatCompletionRequest, ChatRequest]:
            return await asyncio.to_thread(_admitted, raw, policy, renderer, request_id, http,
                                           tenant)

        return await serve_request(http, admit, lambda body, answer: _ChatReply(body))

    @api.post("/v1/responses")
    async def create_response(http: Request) -> Any:
        async def admit(raw: bytes, request_id: str, http: Request, key_tenant: str | None
                        ) -> tuple[_Admitted, ChatRequest]:
            body = await asyncio.to_thread(parse_request, raw, policy.limits)
            tenant = resolve_tenant(policy, policy.tenants.header_value(http.headers),
                                    body.user, key_tenant)
            earlier = await _earlier_response(store, tenant, body)
            limit = await store.max_response_bytes() \
                if store is not None and body.store else None
            turn, request = await asyncio.to_thread(_admitted_response, body, earlier, policy,
                                                    renderer, request_id, http, key_tenant,
                                                    limit)
            return _Admitted(body, turn), request

        def reply(admitted: _Admitted, answer: _Answer) -> _ResponseReply:
            return _ResponseReply(admitted.body, admitted.turn, answer.request.tenant,
                                  new_response_id(), int(time.time()),
                                  store if admitted.body.store else None)

        return await serve_request(http, admit, reply)

    @api.get("/v1/responses/{response_id}")
    async def get_response(http: Request, response_id: str) -> JSONResponse:
        stored = await _stored(http, response_id)
        return JSONResponse(stored.response, headers=_id_header(http))

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(http: Request, response_id: str) -> JSONResponse:
        stored = await _stored(http, response_id)
        await store.delete(stored.tenant, stored.id)
        return JSONResponse({"id": stored.id, "object": "response.deleted", "deleted": True},
                            headers=_id_header(http))

    async def _stored(http: Request, response_id: str) -> StoredResponse:
        """The caller's stored response, or a 404 (unknown, another tenant's, or expired).
        The caller's tenant is found as ``POST`` found it: its API key, else the tenant
        header, else (where the deployment names tenants by ``user``) the ``user`` query
        parameter — a ``GET`` has no body to carry it."""
        _request_id(http)
        tenant = resolve_tenant(policy, policy.tenants.header_value(http.headers),
                                http.query_params.get("user"), tenant_of_key(http))
        found = None
        if store is not None and RESPONSE_ID.fullmatch(response_id):
            found = await store.get(tenant, response_id)
        if found is None:
            hint = " (this server names the tenant by `user`: pass ?user=<the request's " \
                "user>)" if policy.tenants.from_user and keys is None else ""
            raise AdmissionError(404, f"response {response_id[:80]!r} not found{hint}",
                                 param="response_id", code="response_not_found")
        return found

    return api


def _request_id(http: Request) -> str:
    """The request's id in the logs: Ray Serve's (its proxy puts it in ``x-request-id`` and
    on the response, and its log lines carry it), else one of ours. Mutates: ``http.state``."""
    given = http.headers.get(REQUEST_ID_HEADER)
    if given is not None and _REQUEST_ID.fullmatch(given):
        http.state.request_id, http.state.id_is_ours = given, False
    else:
        http.state.request_id, http.state.id_is_ours = uuid.uuid4().hex[:24], True
    return http.state.request_id


_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")


def _id_header(http: Request) -> dict[str, str]:
    """The request id, on every answer (what a user quotes to find it in the logs), unless
    Ray Serve puts it there itself."""
    request_id = getattr(http.state, "request_id", None)
    ours = getattr(http.state, "id_is_ours", True)
    return {REQUEST_ID_HEADER: request_id} if request_id and ours else {}


def _admitted(raw: bytes, policy: AdmissionPolicy, renderer: PromptRenderer | None,
              request_id: str, http: Request, tenant: str | None
              ) -> tuple[ChatCompletionRequest, ChatRequest]:
    return _admitted_chat(parse_body(raw, policy.limits), policy, renderer, request_id, http,
                          tenant)


async def _earlier_response(store: Responses | None, tenant: str, body: ResponsesRequest
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


def _admitted_response(body: ResponsesRequest, earlier: StoredResponse | None,
                       policy: AdmissionPolicy, renderer: PromptRenderer | None,
                       request_id: str, http: Request, key_tenant: str | None,
                       store_limit: int | None) -> tuple[ChatTurn, ChatRequest]:
    """A Responses body admitted as the chat request it means (``earlier``: the turns it
    continues); a refusal names the Responses field. ``store_limit``: the most the response
    may take in the store (None: it is not kept) — one that would not fit is refused here,
    before the model runs."""
    turn = to_chat(body, earlier)
    try:
        _, request = _admitted_chat(validate_chat(turn.document), policy, renderer,
                                    request_id, http, key_tenant)
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


def _admitted_chat(body: ChatCompletionRequest, policy: AdmissionPolicy,
                   renderer: PromptRenderer | None, request_id: str, http: Request,
                   tenant: str | None) -> tuple[ChatCompletionRequest, ChatRequest]:
    request = admit(body, policy, request_id, http.headers.get(SESSION_HEADER),
                    policy.tenants.header_value(http.headers), tenant)
    if renderer is not None:
        request = fit_to_context(renderer.render(request), body, renderer.context_tokens
                                 if policy.limits.context_tokens is None
                                 else policy.limits.context_tokens)
    if policy.request_timeout_s is not None:
        request = replace(request, deadline=time.time() + policy.request_timeout_s)
    return body, request


async def _read_body(http: Request, limit: int) -> bytes:
    """The body, refused (400) once it passes ``limit`` bytes: never read whole first."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> AdmissionError:
    return AdmissionError(400, f"the request body is {size}+ bytes; this server takes at most "
                          f"{limit}", code="request_too_large")


def internal_error_body(request_id: str) -> dict[str, Any]:
    return error_body(f"internal error; the server's logs hold the details under request id "
                      f"{request_id}", "internal_error", code="internal_error")


class _Answer:
    """One admitted request's answer as it is put together: its output stream, its start,
    and the timing of its fragments (for the latency metrics)."""

    def __init__(self, request: ChatRequest, expose_replica: bool, arrived: float) -> None:
        self.request = request
        self.expose_replica = expose_replica
        self.start: StreamStart | None = None
        self.output: ToolCallStream | None = None
        self.mode = metrics.tool_choice_mode(len(request.tools or ()), request.tool_choice)
        self._last_fragment: float | None = None
        self.arrived = arrived
        self._tokens_since = 0  # tokens of steps that brought nothing visible yet

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
        return chat_bodies.extension(self.start, end, self.expose_replica)


async def _events(client: ModelClient, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
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


RETRY_PAUSE_S = 1.0  # for Serve to learn that a replica died before the retry is routed


async def _complete(client: ModelClient, answer: _Answer) -> dict[str, Any]:
    """The whole answer. A replica that dies before answering (a crash, kill -9, its node
    lost) costs the client nothing: the request runs once more, on another replica where
    there is one — safe, since a greedy answer is deterministic and a sampled one keeps its
    seed. The session id is dropped for the retry (its KV cache died with the replica, and
    the session's hash would pick the dead replica again)."""
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
    retry = _Answer(replace(answer.request, session_id=None), answer.expose_replica,
                    answer.arrived)
    return await _complete_once(client, retry)


async def _complete_once(client: ModelClient, answer: _Answer) -> dict[str, Any]:
    end = None
    async for event in _events(client, answer.request):
        if isinstance(event, StreamStart):
            answer.started(event)
        elif isinstance(event, TextStep):
            answer.feed(event)
        else:
            end = event
    if answer.start is None or end is None:
        raise RequestFailed(503, error_body(
            f"the model replica's answer ended early (request id {answer.request.request_id})",
            "service_unavailable", code="replica_unavailable"))
    answer.output.finish()
    return chat_bodies.completion(answer.request, int(time.time()), answer.start, end,
                                answer.output, answer.extension(end))


async def _stream(client: ModelClient, answer: _Answer, include_usage: bool
                  ) -> AsyncIterator[str]:
    request = answer.request
    created = int(time.time())
    try:
        async for event in _events(client, request):
            if isinstance(event, StreamStart):
                answer.started(event)
                yield chat_bodies.chunk(request, created, {"role": "assistant", "content": ""})
            elif isinstance(event, TextStep):
                for delta in chat_bodies.delta_bodies(answer.feed(event)):
                    yield chat_bodies.chunk(request, created, delta)
            elif isinstance(event, StreamEnd):
                yield _final_chunks(answer, created, event, include_usage)
                yield chat_bodies.DONE
                answer.ended(200, stream=True)
                return
        raise RequestFailed(503, error_body(
            f"the model replica's answer ended early (request id {request.request_id})",
            "service_unavailable", code="replica_unavailable"))
    except RequestFailed as failure:
        # Headers are sent already: the error goes in the stream, then the stream ends.
        answer.ended(failure.status, stream=True)
        yield chat_bodies.sse(failure.body)
        yield chat_bodies.DONE
    except Exception:  # a fault must not cut the stream without an error event
        logger.exception("request %s failed mid-stream", request.request_id)
        answer.ended(500, stream=True)
        yield chat_bodies.sse(internal_error_body(request.request_id))
        yield chat_bodies.DONE


def _final_chunks(answer: _Answer, created: int, end: StreamEnd, include_usage: bool) -> str:
    """The last chunks: held-back text, the finish reason, and usage if asked."""
    request, output = answer.request, answer.output
    events = "".join(chat_bodies.chunk(request, created, delta)
                     for delta in chat_bodies.delta_bodies(output.finish()))
    events += chat_bodies.chunk(request, created, {}, chat_bodies.finish_reason(end, output),
                              toolspec=answer.extension(end))
    if include_usage:
        events += chat_bodies.sse({"id": f"chatcmpl-{request.request_id}",
                                 "object": "chat.completion.chunk", "created": created,
                                 "model": request.model, "choices": [],
                                 "usage": chat_bodies.usage(answer.start, end)})
    return events


class _Reply(Protocol):
    """An API's wire shape of one answer: the stream's events, or the whole body."""

    def stream(self, client: ModelClient, answer: _Answer) -> AsyncIterator[str]: ...

    async def finish(self, completion: dict[str, Any]) -> dict[str, Any]: ...


class _ChatReply:
    """Chat completions: the completion as it is, or ``chat.completion.chunk`` events."""

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def stream(self, client: ModelClient, answer: _Answer) -> AsyncIterator[str]:
        return _stream(client, answer, self.include_usage)

    async def finish(self, completion: dict[str, Any]) -> dict[str, Any]:
        return completion


@dataclass(frozen=True)
class _Admitted:
    """A Responses body as admitted: the body, and the chat turn it means."""

    body: ResponsesRequest
    turn: ChatTurn

    @property
    def stream(self) -> bool:
        return self.body.stream


class _ResponseReply:
    """One Responses answer being written: the request read, its id and time, and the store
    that keeps it (None: ``store: false`` or no store)."""

    def __init__(self, body: ResponsesRequest, turn: ChatTurn, tenant: str, response_id: str,
                 created_at: int, store: Responses | None) -> None:
        self.body, self.turn, self.tenant = body, turn, tenant
        self.response_id, self.created_at, self.store = response_id, created_at, store

    def stream(self, client: ModelClient, answer: _Answer) -> AsyncIterator[str]:
        return _stream_response(client, answer, self)

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


async def _stream_response(client: ModelClient, answer: _Answer, reply: _ResponseReply
                           ) -> AsyncIterator[str]:
    """The Responses stream: the same replica events as a chat stream, other event shapes."""
    request = answer.request
    events = ResponseEvents(reply.body, reply.response_id, reply.created_at)
    started = False
    try:
        async for event in _events(client, request):
            if isinstance(event, StreamStart):
                answer.started(event)
                started = True
                yield events.start()
            elif isinstance(event, TextStep):
                yield events.feed(answer.feed(event))
            elif isinstance(event, StreamEnd):
                tail = events.feed(answer.output.finish())
                incomplete = "max_output_tokens" if event.finish_reason == "length" else None
                closing, response = events.finish(chat_bodies.usage(answer.start, event),
                                                  incomplete, answer.extension(event))
                await reply.keep(response)
                yield tail + closing
                answer.ended(200, stream=True)
                return
        raise RequestFailed(503, error_body(
            f"the model replica's answer ended early (request id {request.request_id})",
            "service_unavailable", code="replica_unavailable"))
    except RequestFailed as failure:
        answer.ended(failure.status, stream=True)
        yield ("" if started else events.start()) + events.fail(failure.body)
    except Exception:  # a fault must not cut the stream without an error event
        logger.exception("request %s failed mid-stream", request.request_id)
        answer.ended(500, stream=True)
        yield ("" if started else events.start()) + \
            events.fail(internal_error_body(request.request_id))
