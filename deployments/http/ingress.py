"""The HTTP ingress deployment: the OpenAI API app over a handle to the model replicas.

The session id (``x-session-id`` header, else the body's ``user``) is passed on with
``handle.options(session_id=...)``: Serve does not carry it from the proxy to the next hop, and
the model deployment's consistent-hash router needs it to keep a session on one replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError, RayServeException

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.http.auth import ApiKeySource
from deployments.http.prompting import PromptRenderer
from deployments.messages import (
    ChatRequest,
    ReplicaBusyError,
    ReplicaEvent,
    ReplicaUnavailableError,
)
from deployments.stored_responses.service import RemoteResponses

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class ServeModelClient:
    """``ModelClient`` over a Serve handle to the model deployment."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle.options(stream=True)
        self._calls = handle  # not streamed: describe

    async def describe(self) -> dict[str, Any]:
        try:
            return await self._calls.describe.remote()
        except BackPressureError as error:
            raise ReplicaBusyError(error.message, error.retry_after_s or 1.0) from error
        except (RayError, RayServeException) as error:
            raise ReplicaUnavailableError(f"{type(error).__name__}: {error}") from error

    async def deployments(self) -> dict[str, Any] | None:
        """Serve's view of this application's deployments (the controller's, which needs
        no replica to answer): per deployment its status and replicas by state."""
        return await asyncio.to_thread(_application_status)

    async def stream(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        handle = self._handle
        if request.session_id:
            handle = handle.options(session_id=request.session_id)
        response, settled = None, False
        try:
            # The router may refuse at once (queue full): inside the try, like the events.
            response = handle.generate.remote(request)
            async for event in response:
                yield event
            settled = True
        except BackPressureError as error:
            settled = True
            raise ReplicaBusyError(error.message, error.retry_after_s or 1.0) from error
        except (RayError, RayServeException) as error:
            settled = True
            raise ReplicaUnavailableError(f"{type(error).__name__}: {error}") from error
        finally:
            if response is not None and not settled:
                _cancel(response)  # the client left or the deadline passed: stop its work


def _application_status() -> dict[str, Any]:
    app = serve.get_replica_context().app_name
    status = serve.status().applications[app]
    return {name: {"status": _plain(deployment.status),
                   "replicas": {_plain(state): count
                                for state, count in deployment.replica_states.items()}}
            for name, deployment in status.deployments.items()}


def _plain(value: Any) -> str:
    return str(getattr(value, "value", value))


def _cancel(response: Any) -> None:
    """Cancel a running handle call. A call whose assignment failed re-raises that failure
    from ``cancel``; it was answered already."""
    try:
        response.cancel()
    except Exception as error:  # noqa: BLE001 - nothing left to stop
        logger.debug("cancelling a handle call: %s", error)


@serve.ingress()
class Ingress:
    """Serve deployment class; the FastAPI app is built per replica from its arguments.
    ``renderer_model``: the model whose chat template and tokenizer count prompts at
    admission (None: the replica counts them); ``api_keys``: where the keys are, if any;
    ``responses``: a handle to the response store's deployment (None: none kept)."""

    def __init__(self, model: Any, policy: AdmissionPolicy,
                 renderer_model: str | None = None,
                 api_keys: ApiKeySource = ApiKeySource(),
                 responses: Any | None = None) -> None:
        self.client = ServeModelClient(model)
        self.policy = policy
        self.renderer = PromptRenderer(renderer_model) if renderer_model else None
        # Read here, on the ingress's node (a mounted secret, its environment); a deployment
        # that names keys it cannot read fails to start rather than start open.
        self.keys = api_keys.load() if api_keys.configured else None
        # One store for every ingress replica, in its own actor (None: no responses kept).
        self.store = RemoteResponses(responses) if responses is not None else None

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_api(self.client, self.policy, self.renderer, self.keys, self.store)
