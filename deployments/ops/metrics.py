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

from toolspec.core.prefix_cache import PrefixCacheStats

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
    "toolspec_prompt_tokens", "Prompt tokens of finished requests, by whether their keys and "
    "values came from the replica's prefix cache (cached) or were computed.",
    tag_keys=("cached",))
PREFIX_CACHE_BLOCKS = metrics.Counter(
    "toolspec_prefix_cache_blocks", "Prompt blocks by what the prefix cache did with them: hit "
    "(a request took it), miss (a request looked it up and computed it), inserted, evicted.",
    tag_keys=("event",))
PREFIX_CACHE_BYTES = metrics.Gauge(
    "toolspec_prefix_cache_bytes", "Bytes of keys and values the replica's prefix cache holds, "
    "and its budget.", tag_keys=("kind",))
ROUTING_DECISIONS = metrics.Counter(
    "toolspec_routing_decisions", "Requests routed to a model replica, by why that replica: "
    "session (where its session went), prefix (holds its prompt's first blocks), home (the "
    "rendezvous hash of a prompt no replica holds), rebalanced (its best place's queue was too "
    "long), fallback (the first choice was full).", tag_keys=("reason",))
ROUTED_PREFIX_BLOCKS = metrics.Counter(
    "toolspec_routed_prefix_blocks", "Prompt blocks of routed requests (total) and those the "
    "chosen replica was known to hold (matched): the router's expected prefix hit rate.",
    tag_keys=("kind",))
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
    """One verification step. Its timings are observed where they were measured (vLLM's
    engine reports no step times: 0)."""
    TOKENS_PER_STEP.observe(emitted)
    if verify_s > 0:
        DRAFT_SECONDS.observe(draft_s)
        VERIFY_SECONDS.observe(verify_s)
    if nodes:
        DRAFTED_NODES.inc(nodes)
    record_accepted(accepted_by_source)


def record_accepted(accepted_by_source: Mapping[str, int]) -> None:
    """Draft tokens the model accepted, by the source that drafted them."""
    for source, count in accepted_by_source.items():
        if count:
            ACCEPTED_DRAFT_TOKENS.inc(count, tags={"source": source})


def record_batch(jobs: int) -> None:
    BATCH_SIZE.observe(jobs)


def record_rows(prompt_rows: int, decode_rows: int, cached_tokens: int = 0) -> None:
    """A step's forward rows by kind, and the prompt tokens it took from the prefix cache
    instead (``cached``: rows it did not have to run)."""
    if prompt_rows:
        FORWARD_ROWS.inc(prompt_rows, tags={"kind": "prompt"})
    if decode_rows:
        FORWARD_ROWS.inc(decode_rows, tags={"kind": "decode"})
    if cached_tokens:
        FORWARD_ROWS.inc(cached_tokens, tags={"kind": "cached"})


_prefix_counts: dict[str, int] = {}  # the prefix cache's totals already exported


def record_prefix_cache(stats: PrefixCacheStats) -> None:
    """Export what changed in the prefix cache's totals since the last call (one replica, one
    cache: a cache made anew starts its totals from zero again)."""
    totals = {"hit": stats.hit_blocks, "miss": stats.missed_blocks,
              "inserted": stats.inserted_blocks, "evicted": stats.evicted_blocks}
    for event, total in totals.items():
        seen = _prefix_counts.get(event, 0)
        if total < seen:  # a new cache
            seen = 0
        if total > seen:
            PREFIX_CACHE_BLOCKS.inc(total - seen, tags={"event": event})
        _prefix_counts[event] = total
    PREFIX_CACHE_BYTES.set(stats.bytes, tags={"kind": "used"})
    PREFIX_CACHE_BYTES.set(stats.budget_bytes, tags={"kind": "budget"})


def record_queue(batched: int, waiting: int) -> None:
    ACTIVE_REQUESTS.set(batched, tags={"state": "batched"})
    ACTIVE_REQUESTS.set(waiting, tags={"state": "waiting"})


def record_prompt(prompt_tokens: int, reused: int) -> None:
    if reused:
        PROMPT_TOKENS.inc(reused, tags={"cached": "true"})
    if prompt_tokens > reused:
        PROMPT_TOKENS.inc(prompt_tokens - reused, tags={"cached": "false"})


def record_routing(reason: str, matched_blocks: int, total_blocks: int) -> None:
    ROUTING_DECISIONS.inc(tags={"reason": reason})
    if matched_blocks:
        ROUTED_PREFIX_BLOCKS.inc(matched_blocks, tags={"kind": "matched"})
    if total_blocks:
        ROUTED_PREFIX_BLOCKS.inc(total_blocks, tags={"kind": "total"})


def record_library_lookup(kind: str, outcome: str, seconds: float) -> None:
    LIBRARY_LOOKUPS.inc(tags={"kind": kind, "outcome": outcome})
    LIBRARY_LOOKUP_SECONDS.observe(seconds, tags={"kind": kind})


def record_library_add(outcome: str, calls: int) -> None:
    if calls:
        LIBRARY_ADDS.inc(calls, tags={"outcome": outcome})


def tool_choice_mode(tools: int, tool_choice: str) -> str:
    """The ``mode`` tag of a request: ``no_tools``, or its ``tool_choice``."""
    return tool_choice if tools else "no_tools"
