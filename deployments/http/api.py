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
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.http.admission import AdmissionError, AdmissionPolicy, error_body, resolve_tenant
from deployments.http.answer import (
    Answer,
    Reply,
    RequestFailed,
    complete,
    internal_error_body,
    stream_answer,
)
from deployments.http.auth import ApiKeys
from deployments.http.chat.serving import ChatReply, admit_raw_chat
from deployments.http.health import LoadedModel, health_report
from deployments.http.model_client import ModelClient
from deployments.http.prompting import PromptRenderer
from deployments.http.responses.protocol import RESPONSE_ID, parse_request
from deployments.http.responses.serving import (
    AdmittedResponse,
    ResponseReply,
    admit_response,
    earlier_response,
)
from deployments.http.schemas import ChatCompletionRequest
from deployments.messages import ChatRequest
from deployments.ops import metrics
from deployments.ops.tracing import tracer
from deployments.stored_responses.service import Responses, ResponseStoreUnavailableError
from deployments.stored_responses.store import StoredResponse

REQUEST_ID_HEADER = "x-request-id"
logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


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
            "device": described.get("device"),
            "speculative_method": described.get("speculative_method"),
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
                            reply: Callable[[Any, Answer], Reply]) -> Any:
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
            answer = Answer(request, policy.expose_replica, arrived)
            shape = reply(body, answer)
            if body.stream:
                # The stream outlives this span; its replica call is traced on its own.
                return StreamingResponse(stream_answer(client, answer, shape),
                                         media_type="text/event-stream",
                                         headers=_id_header(http))
            try:
                result = await complete(client, answer)
            except RequestFailed as failure:
                answer.ended(failure.status, stream=False)
                return failure.response(_id_header(http))
            answer.ended(200, stream=False)
            return JSONResponse(await shape.finish(result), headers=_id_header(http))

    @api.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Any:
        async def admit(raw: bytes, request_id: str, http: Request, tenant: str | None
                        ) -> tuple[ChatCompletionRequest, ChatRequest]:
            return await asyncio.to_thread(admit_raw_chat, raw, policy, renderer, request_id,
                                           http.headers, tenant)

        return await serve_request(http, admit, lambda body, answer: ChatReply(body))

    @api.post("/v1/responses")
    async def create_response(http: Request) -> Any:
        async def admit(raw: bytes, request_id: str, http: Request, key_tenant: str | None
                        ) -> tuple[AdmittedResponse, ChatRequest]:
            body = await asyncio.to_thread(parse_request, raw, policy.limits)
            tenant = resolve_tenant(policy, policy.tenants.header_value(http.headers),
                                    body.user, key_tenant)
            earlier = await earlier_response(store, tenant, body)
            limit = await store.max_response_bytes() \
                if store is not None and body.store else None
            turn, request = await asyncio.to_thread(admit_response, body, earlier, policy,
                                                    renderer, request_id, http.headers,
                                                    key_tenant, limit)
            return AdmittedResponse(body, turn), request

        def reply(admitted: AdmittedResponse, answer: Answer) -> ResponseReply:
            return ResponseReply(admitted, answer.request.tenant, store)

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
