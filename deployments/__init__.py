"""Ray Serve deployments of ToolSpec: OpenAI-compatible ingress, model replicas, call library.

``build_app(AppConfig(...))`` gives the bound application; ``app_builder`` is the entry point
``serve_config.yaml`` names. The names are imported on first use, so a replica process that
imports ``deployments.replica.model_replica`` does not load the HTTP layer (the builder pulls
in the ingress).

Parts, named for the processes that run them: ``http`` (the ingress), ``replica`` (a model
replica and its engines), ``library`` (the retrieval actors; a replica's library view),
``stored_responses`` (the Responses API's store), ``routing`` (picking a replica), ``ops``
(metrics, tracing, names, readiness), ``messages`` (what the ingress and a replica send each
other), ``app`` (config and ``build_app``, the only part that sees them all).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {name: "deployments.app.builder"
            for name in ("AppConfig", "LibraryConfig", "ModelConfig", "app_builder", "build_app")}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'deployments' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
