"""The stored responses' one owner: a Serve deployment every ingress replica reaches.

A store on each ingress's node is a store per node: with two ingress replicas on two nodes, a
``previous_response_id`` or ``GET /v1/responses/{id}`` that reaches the other one is a 404;
and LMDB's own documentation advises against putting its file on a network filesystem. So one
actor (``ResponseService``, one replica: one writer) opens the store (``ResponseStore``) where
its files are, and every ingress replica calls it (``RemoteResponses``) — as the model
replicas call the call library's actors (``deployments.library.service``). ``LocalResponses``
is the same interface over a store in this process (tests, a single process).

Mutates: the store, through its methods.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException

from deployments.stored_responses.store import ResponseStore, StoredResponse

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the actor's Serve log


class ResponseStoreUnavailableError(Exception):
    """The response store's actor could not be reached (it is restarting, or its node is
    gone)."""


class Responses(Protocol):
    """Where the API keeps ``store: true`` responses. ``put`` raises ResponseTooLargeError
    (nothing kept) for one past ``max_response_bytes``; every method may raise
    ResponseStoreUnavailableError."""

    async def max_response_bytes(self) -> int:
        """The most one stored response may take."""

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def put(self, stored: StoredResponse) -> None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


class LocalResponses:
    """``Responses`` over a ``ResponseStore`` in this process (its LMDB work on worker
    threads). Mutates: the store (``put``, ``delete``)."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def max_response_bytes(self) -> int:
        return self.store.max_response_bytes

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await asyncio.to_thread(self.store.get, tenant, response_id)

    async def put(self, stored: StoredResponse) -> None:
        await asyncio.to_thread(self.store.put, stored)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await asyncio.to_thread(self.store.delete, tenant, response_id)


def default_responses_path() -> str:
    from toolspec import toolspec_home

    return str(toolspec_home() / "responses")


class ResponseService(LocalResponses):
    """The Serve deployment owning the store: opened here, on the node this actor runs on
    (``path`` None: ``$TOOLSPEC_HOME/responses`` of that node). LMDB serialises the writers;
    readers never wait for them. Mutates: the store on disk."""

    def __init__(self, path: str | None = None, max_age_s: float = 30 * 86400,
                 max_responses: int = 100_000, max_bytes: int = 1 << 30) -> None:
        super().__init__(ResponseStore(Path(path or default_responses_path()), max_age_s,
                                       max_responses, max_bytes))

    def check_health(self) -> None:
        self.store.count()  # raises if the environment cannot be read

    def __del__(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()


class RemoteResponses:
    """``Responses`` over a Serve handle to the ``ResponseService`` deployment. The store's
    refusals come back as raised there (ResponseTooLargeError); failing to reach it is
    ResponseStoreUnavailableError. Mutates: its copy of the store's limit, asked once."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._limit: int | None = None

    async def max_response_bytes(self) -> int:
        if self._limit is None:
            self._limit = await self._call("max_response_bytes")
        return self._limit

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._call("get", tenant, response_id)

    async def put(self, stored: StoredResponse) -> None:
        await self._call("put", stored)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._call("delete", tenant, response_id)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except RayServeException as error:
            raise ResponseStoreUnavailableError(f"{type(error).__name__}: {error}") from error
        except RayError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, Exception) and not isinstance(cause, RayError):
                raise cause from None  # the store's own refusal (ResponseTooLargeError, ...)
            raise ResponseStoreUnavailableError(f"{type(error).__name__}: {error}") from error
