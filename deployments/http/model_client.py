"""How the ingress reaches the model replicas: ``ModelClient``, the one interface the HTTP API
and the health check call (``deployments.http.ingress.ServeModelClient`` over a Serve handle;
tests use one that calls a replica in process)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from deployments.messages import ChatRequest, ReplicaEvent


class ModelClient(Protocol):
    """Reaches a model replica; the session id (if any) picks which one."""

    def stream(self, request: ChatRequest) -> AsyncIterator[ReplicaEvent]:
        """The replica's events for ``request``; raises ReplicaUnavailableError (or its
        subclass ReplicaBusyError when every replica's queue is full). Leaving the iterator
        early cancels the request on the replica."""

    async def describe(self) -> dict[str, Any]:
        """One replica's ``ModelReplica.describe``; raises as ``stream``."""

    async def deployments(self) -> dict[str, Any] | None:
        """Each deployment's status and replicas by state, as Serve sees them (None where
        the client does not run under Serve)."""
