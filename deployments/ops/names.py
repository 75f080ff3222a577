"""The names the builder deploys the Serve deployments under, and that ``/health`` reads
Serve's status by.

Constants and the retrieval actors' naming rule, written once: the builder names the
deployments by them and ``deployments.http.health`` reads Serve's status by them. Nothing
mutates.
"""

from __future__ import annotations

import re

MODEL_DEPLOYMENT = "ModelServer"
# With several retrieval actors, each owning a part of the shards: ``CallLibraryService-<i>``.
LIBRARY_DEPLOYMENT = "CallLibraryService"
_LIBRARY_PART = re.compile(rf"{LIBRARY_DEPLOYMENT}(-[0-9]+)?")
# The one owner of the stored responses (``store: true``), which every ingress replica calls.
RESPONSES_DEPLOYMENT = "ResponseStore"


def library_deployment_name(index: int, actors: int) -> str:
    """The deployment of retrieval actor ``index`` of ``actors``."""
    return LIBRARY_DEPLOYMENT if actors == 1 else f"{LIBRARY_DEPLOYMENT}-{index}"


def is_library_deployment(name: str) -> bool:
    """Whether ``name`` is one that ``library_deployment_name`` gives."""
    return _LIBRARY_PART.fullmatch(name) is not None
