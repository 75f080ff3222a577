"""OpenTelemetry spans of the served system: request → admission → prefill → verify steps →
library add.

Spans go to whatever tracer provider the process has. Under Ray Serve that is the one Serve
sets up from ``tracing_config`` in ``serve_config.yaml`` (file exporter by default, under
``/tmp/ray/session_latest/logs/serve/``; ``exporter_import_path`` may name
``deployments.ops.tracing:console_exporter`` or ``deployments.ops.tracing:otlp_exporter``), and
Serve carries the trace context from the proxy through the ingress to the replica, so one request is
one trace. Without a provider the spans cost next to nothing (the API's no-op tracer).

Prefill and verify steps run on the scheduler's worker thread and are timed by the engine;
their spans are recorded afterwards with the measured start and end times.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace import Span

from toolspec.core.engine import StepStats

tracer = trace.get_tracer("toolspec.serve")


def record_span(name: str, started_s: float, duration_s: float, parent: Span,
                attributes: Mapping[str, str | int | float] | None = None) -> None:
    """A finished child span of ``parent``, ``duration_s`` long, that began at ``started_s``
    (``time.perf_counter`` clock)."""
    offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)
    start_ns = offset_ns + int(started_s * 1e9)
    span = tracer.start_span(name, context=trace.set_span_in_context(parent),
                             start_time=start_ns, attributes=dict(attributes or {}))
    span.end(end_time=start_ns + int(duration_s * 1e9))


def record_step(stats: StepStats, ended_s: float, parent: Span) -> None:
    """One verify step (draft + verify + commit) that ended at ``ended_s``."""
    duration = stats.draft_s + stats.verify_s + stats.commit_s
    attributes: dict[str, str | int | float] = {
        "toolspec.nodes": stats.nodes, "toolspec.accepted": stats.accepted,
        "toolspec.emitted": stats.emitted, "toolspec.verify_s": stats.verify_s}
    for source, count in stats.accepted_by_source.items():
        attributes[f"toolspec.accepted.{source}"] = count
    record_span("toolspec.verify_step", ended_s - duration, duration, parent, attributes)


def console_exporter() -> list[SpanProcessor]:
    """``tracing_config.exporter_import_path``: spans printed to each process's stdout."""
    return [SimpleSpanProcessor(ConsoleSpanExporter())]


def otlp_exporter() -> list[SpanProcessor]:
    """``tracing_config.exporter_import_path``: spans sent to an OTLP collector
    (``OTEL_EXPORTER_OTLP_ENDPOINT``); needs ``opentelemetry-exporter-otlp``."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as error:
        raise ImportError("the OTLP exporter needs `pip install opentelemetry-exporter-otlp`; "
                          "or use deployments.ops.tracing:console_exporter") from error
    return [BatchSpanProcessor(OTLPSpanExporter())]
