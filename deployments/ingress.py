"""The HTTP ingress deployment: the OpenAI API app over a handle to the model replicas.

The session id (``x-session-id`` header, else the body's ``user``) is passed on with
``handle.options(session_id=...)``: Serve does not carry it from the proxy to the next hop, and
the model deployment's consistent-hash router needs it to keep a session on one replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException

from deployments.admission import AdmissionPolicy
from deployments.api import create_api
from deployments.messages import ChatRequest, ReplicaEvent, ReplicaUnavailableError


class ServeModelClient:
    """``ModelClient`` over a Serve handle to the model deployment."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle.options(stream=True)

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        handle = self._handle
        if request.session_id:
            handle = handle.options(session_id=request.session_id)
        try:
            async for event in handle.generate.remote(request):
                yield event
        except (RayError, RayServeException) as error:
            raise ReplicaUnavailableError(f"{type(error).__name__}: {error}") from error


@serve.ingress()
class Ingress:
    """Serve deployment class; the FastAPI app is built per replica from its arguments."""

    def __init__(self, model: Any, policy: AdmissionPolicy) -> None:
        self.client = ServeModelClient(model)
        self.policy = policy

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self.client, self.policy)
