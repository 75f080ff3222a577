"""``GET /health``: whether the app can serve, and what the model replicas have loaded.

Reads Serve's controller status of each deployment (``ModelClient.deployments``), by the names
the builder deploys them under (``deployments.ops.names``), so a health check never waits in a
busy replica's queue; where there is no controller (a client outside Serve), it asks one model
replica (``ModelClient.describe``). Caches: the replicas' description (``LoadedModel``, kept
for ``ttl_s``; ``/v1/models`` reads the same copy). Mutates nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from deployments.http.model_client import ModelClient
from deployments.messages import ReplicaUnavailableError
from deployments.ops.names import MODEL_DEPLOYMENT, is_library_deployment

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the replica's Serve log


class LoadedModel:
    """What the model replicas have loaded, asked of one of them and kept for ``ttl_s`` (it
    changes only when ``user_config`` reloads the model). Mutates: its copy."""

    def __init__(self, client: ModelClient, ttl_s: float = 60.0,
                 timeout_s: float = 5.0) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._described: dict[str, Any] | None = None
        self._at = 0.0

    async def get(self, fresh: bool = False) -> dict[str, Any] | None:
        """The latest description (None if no replica answered in time)."""
        if fresh or self._described is None or time.monotonic() - self._at > self.ttl_s:
            try:
                self._described = await asyncio.wait_for(self.client.describe(),
                                                          self.timeout_s)
                self._at = time.monotonic()
            except (TimeoutError, ReplicaUnavailableError) as error:
                logger.warning("no model replica described itself: %s",
                               type(error).__name__)
                if fresh:
                    return None
        return self._described


async def health_report(client: ModelClient, loaded: LoadedModel) -> dict[str, Any]:
    """``ok``: a model replica runs and the retrieval actor too (or there is none);
    ``degraded``: the model serves, retrieval is down (drafting goes on without it);
    ``unavailable``: no model replica runs. Under Serve the states are the controller's (no
    request waits in a busy replica's queue); elsewhere a replica is asked."""
    try:
        deployments = await client.deployments()
    except Exception as error:  # noqa: BLE001 - the controller unreachable: ask a replica
        logger.warning("Serve's status unavailable for /health: %s", type(error).__name__)
        deployments = None
    if deployments is not None:
        model_up = deployments.get(MODEL_DEPLOYMENT, {}).get("replicas", {}).get("RUNNING", 0) > 0
        parts = [status for name, status in deployments.items()
                 if is_library_deployment(name)]
        library = "disabled" if not parts else (
            "reachable" if all(part["replicas"].get("RUNNING", 0) > 0 for part in parts)
            else "unreachable")  # a part down: its tools are drafted without retrieval
        described = await loaded.get() if model_up else None
    else:
        described = await loaded.get(fresh=True)
        model_up = described is not None
        library = described.get("library", "disabled") if described else "unreachable"
    status = "unavailable" if not model_up else "degraded" if library == "unreachable" else "ok"
    report: dict[str, Any] = {"status": status, "library": library}
    if described is not None:
        report["model"] = {key: described[key] for key in ("model", "dtype", "context_tokens")
                           if key in described}
    if deployments is not None:
        report["deployments"] = deployments
    return report
