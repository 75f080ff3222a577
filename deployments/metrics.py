"""Application metrics, in Prometheus through Ray (``ray.serve.metrics``), named ``toolspec_*``.

Every metric ToolSpec exports is defined here, once per process, and recorded through the
functions below by the component that sees the event: the ingress (requests, admission
refusals, time to first token, inter-token latency), the replica (per verification step, per
forward, per request's prompt) and the replica's library view (lookups, adds). Ray adds the
deployment, replica and application tags and serves them on each node's metrics port
(``ray start --metrics-export-port``), with a ``ray_`` prefix: ``ray_toolspec_requests_total``.
``cluster/grafana-toolspec.json`` is a dashboard built on them.

Recording never fails a request: outside a Ray worker the metrics record nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ray.serve import metrics

_SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_FAST_SECONDS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
_TOKENS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
_SIZES = [1, 2, 4, 8, 16, 32, 64]

REQUESTS = metrics.Counter(
    "toolspec_requests", "Chat completion requests answered, by HTTP status, tool_choice mode "
    "(no_tools, auto, none, required, named) and whether streamed.",
    tag_keys=("status", "mode", "stream"))
ADMISSION_REFUSALS = metrics.Counter(
    "toolspec_admission_refusals", "Requests refused before any model work, by reason (the "
    "error object's code, e.g. context_length_exceeded, too_many_tools, queue_full).",
    tag_keys=("reason",))
RETRIES = metrics.Counter(
    "toolspec_retries", "Non-streaming requests run again because their replica failed "
    "before answering.")
TIME_TO_FIRST_TOKEN = metrics.Histogram(
    "toolspec_time_to_first_token_seconds", "From the request's arrival to the first content "
    "or tool-call fragment, by tool_choice mode.", boundaries=_SECONDS, tag_keys=("mode",))
INTER_TOKEN_LATENCY = metrics.Histogram(
    "toolspec_inter_token_latency_seconds", "Time between output fragments divided by the "
    "tokens the later one brought (a verification step brings several).",
    boundaries=_FAST_SECONDS)
TOKENS_PER_STEP = metrics.Histogram(
    "toolspec_tokens_per_step", "Tokens one verification step added to a request's output "
    "(accepted drafts + the bonus token).", boundaries=_TOKENS)
ACCEPTED_DRAFT_TOKENS = metrics.Counter(
    "toolspec_accepted_draft_tokens", "Draft tokens accepted, by draft source (schema/*, "
    "retrieval, suffix, ...).", tag_keys=("source",))
DRAFTED_NODES = metrics.Counter(
    "toolspec_draft_nodes", "Draft nodes verified (the acceptance rate is accepted over this).")
DRAFT_SECONDS = metrics.Histogram(
    "toolspec_draft_seconds", "Drafting time of one request's step (propose, observe).",
    boundaries=_FAST_SECONDS)
VERIFY_SECONDS = metrics.Histogram(
    "toolspec_verify_seconds", "The forward of one step (shared by the requests batched in "
    "it).", boundaries=_SECONDS)
BATCH_SIZE = metrics.Histogram(
    "toolspec_batch_size", "Requests in one forward.", boundaries=_SIZES)
FORWARD_ROWS = metrics.Counter(
    "toolspec_forward_rows", "Rows run by forwards, by kind (prompt: prefill chunks; decode: "
    "roots and draft nodes).", tag_keys=("kind",))
ACTIVE_REQUESTS = metrics.Gauge(
    "toolspec_active_requests", "Requests a replica is decoding (in its batch) or holding "
    "(waiting for a batch slot).", tag_keys=("state",))
PROMPT_TOKENS = metrics.Counter(
    "toolspec_prompt_tokens", "Prompt tokens of started requests, by whether their keys and "
    "values were reused from the session's earlier turn (cached) or computed.",
    tag_keys=("cached",))
LIBRARY_LOOKUPS = metrics.Counter(
    "toolspec_library_lookups", "Calls to the retrieval actor, by kind (prefetch at request "
    "start, decode-time lookup) and outcome (hit: brought calls, miss: none, failure).",
    tag_keys=("kind", "outcome"))
LIBRARY_LOOKUP_SECONDS = metrics.Histogram(
    "toolspec_library_lookup_seconds", "Latency of calls to the retrieval actor, by kind.",
    boundaries=_SECONDS, tag_keys=("kind",))
LIBRARY_ADDS = metrics.Counter(
    "toolspec_library_adds", "Finished calls sent to the shared library, by outcome (stored, "
    "failure).", tag_keys=("outcome",))


def record_request(status: int, mode: str, stream: bool) -> None:
    REQUESTS.inc(tags={"status": str(status), "mode": mode, "stream": str(stream).lower()})


def record_refusal(reason: str) -> None:
    ADMISSION_REFUSALS.inc(tags={"reason": reason or "invalid_request"})


def record_retry() -> None:
    RETRIES.inc()


def record_first_token(seconds: float, mode: str) -> None:
    TIME_TO_FIRST_TOKEN.observe(seconds, tags={"mode": mode})


def record_inter_token(seconds: float, tokens: int) -> None:
    if tokens > 0:
        INTER_TOKEN_LATENCY.observe(seconds / tokens)


def record_step(emitted: int, nodes: int, accepted_by_source: Mapping[str, int],
                draft_s: float, verify_s: float) -> None:
    TOKENS_PER_STEP.observe(emitted)
    DRAFT_SECONDS.observe(draft_s)
    VERIFY_SECONDS.observe(verify_s)
    if nodes:
        DRAFTED_NODES.inc(nodes)
    for source, count in accepted_by_source.items():
        if count:
            ACCEPTED_DRAFT_TOKENS.inc(count, tags={"source": source})


def record_batch(jobs: int) -> None:
    BATCH_SIZE.observe(jobs)


def record_rows(prompt_rows: int, decode_rows: int) -> None:
    if prompt_rows:
        FORWARD_ROWS.inc(prompt_rows, tags={"kind": "prompt"})
    if decode_rows:
        FORWARD_ROWS.inc(decode_rows, tags={"kind": "decode"})


def record_queue(batched: int, waiting: int) -> None:
    ACTIVE_REQUESTS.set(batched, tags={"state": "batched"})
    ACTIVE_REQUESTS.set(waiting, tags={"state": "waiting"})


def record_prompt(prompt_tokens: int, reused: int) -> None:
    if reused:
        PROMPT_TOKENS.inc(reused, tags={"cached": "true"})
    if prompt_tokens > reused:
        PROMPT_TOKENS.inc(prompt_tokens - reused, tags={"cached": "false"})


def record_library_lookup(kind: str, outcome: str, seconds: float) -> None:
    LIBRARY_LOOKUPS.inc(tags={"kind": kind, "outcome": outcome})
    LIBRARY_LOOKUP_SECONDS.observe(seconds, tags={"kind": kind})


def record_library_add(outcome: str, calls: int) -> None:
    if calls:
        LIBRARY_ADDS.inc(calls, tags={"outcome": outcome})


def tool_choice_mode(tools: int, tool_choice: str) -> str:
    """The ``mode`` tag of a request: ``no_tools``, or its ``tool_choice``."""
    return tool_choice if tools else "no_tools"
