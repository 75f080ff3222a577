"""One request leaves one trace: request → admission → generate → prefill, verify steps →
library add."""

from __future__ import annotations

from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_fakes import LocalModelClient, ScriptedChatEngine, fixed

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.library.cache import LibraryCache
from deployments.replica.model_replica import ModelReplica

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def test_a_request_is_one_trace_with_a_span_per_verify_step() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; no other test sets one

    cache = LibraryCache(None)
    replica = ModelReplica(ScriptedChatEngine(script=fixed(CALL[:9], CALL[9:40], CALL[40:])), cache)
    client = TestClient(create_api(LocalModelClient(replica), AdmissionPolicy(("toy",))))
    response = client.post("/v1/chat/completions", json={
        "model": "toy", "tools": [WEATHER], "messages": [{"role": "user", "content": "Oslo?"}]})
    assert response.status_code == 200
    cache.close()

    spans = {span.name: span for span in exporter.get_finished_spans()}
    steps = [s for s in exporter.get_finished_spans() if s.name == "toolspec.verify_step"]
    assert {"toolspec.request", "toolspec.admission", "toolspec.generate", "toolspec.prefill",
            "toolspec.library.add"} <= set(spans)
    assert len(steps) == 2 and steps[0].attributes["toolspec.nodes"] == 33
    root = spans["toolspec.request"].context
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {root.trace_id}
    assert spans["toolspec.generate"].parent.span_id == root.span_id
    assert all(s.parent.span_id == spans["toolspec.generate"].context.span_id for s in steps)
