"""The names the builder deploys the Serve deployments under, and that ``/health`` reads
Serve's status by.

Constants only, importing nothing: the builder (which imports the ingress, and through it the
HTTP app) and ``deployments.http.health`` both import them here, without a cycle. Nothing mutates.
"""

from __future__ import annotations

MODEL_DEPLOYMENT = "ModelServer"
# With several retrieval actors, each owning a part of the shards: ``CallLibraryService-<i>``.
LIBRARY_DEPLOYMENT = "CallLibraryService"
# The one owner of the stored responses (``store: true``), which every ingress replica calls.
RESPONSES_DEPLOYMENT = "ResponseStore"
