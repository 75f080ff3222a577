"""The HTTP edge over a scripted engine (no Ray, no model): limits checked before any model
work, OpenAI fields supported or refused (never ignored), and failures that answer with error
objects — 429 with Retry-After, 504 past the deadline, 5xx without exception text — while the
replica keeps serving."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serve_fakes import FailingChatEngine, LocalModelClient, ScriptedChatEngine, fixed

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.http.limits import AdmissionLimits, json_depth
from deployments.http.prompting import fit_to_context
from deployments.messages import ChatRequest, ContextLengthError, ReplicaBusyError
from deployments.replica.model_replica import ModelReplica

MODEL = "toy-model"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
URL = "/v1/chat/completions"


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            **fields}


class CountingRenderer:
    """A ``PromptRenderer`` whose prompt is one token per character of the messages."""

    def __init__(self, context_tokens: int) -> None:
        self.context_tokens = context_tokens

    def render(self, request: ChatRequest) -> ChatRequest:
        text = "".join(str(m["content"]) for m in request.messages)
        return replace(request, prompt_ids=tuple(range(len(text))), prompt_model=MODEL,
                       call_format="hermes")


def make_client(engine: ScriptedChatEngine | None = None, renderer: Any = None,
                **policy: Any) -> tuple[TestClient, ScriptedChatEngine]:
    engine = engine or ScriptedChatEngine(script=fixed(CALL))
    api = create_api(LocalModelClient(ModelReplica(engine, name="replica-0")),
                     AdmissionPolicy((MODEL,), **policy), renderer)
    return TestClient(api, raise_server_exceptions=False), engine


def refused(response: Any, param: str | None, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert code is None or error["code"] == code
    return error


# ---- limits -------------------------------------------------------------------------------

def test_a_body_over_the_size_limit_is_refused_before_parsing() -> None:
    client, engine = make_client(limits=AdmissionLimits(max_body_bytes=2048))
    big = json.dumps(body(messages=[{"role": "user", "content": "x" * 4000}]))
    error = refused(client.post(URL, content=big, headers={"content-type": "application/json"}),
                    None, "request_too_large")
    assert "2048" in error["message"]
    chunked = client.post(URL, content=iter([big[:1000].encode(), big[1000:].encode()]))
    refused(chunked, None, "request_too_large")  # no content-length: counted while read
    assert engine.requests == []


def test_deep_nesting_is_a_400_not_a_recursion_error() -> None:
    client, _ = make_client()
    for depth in (100, 5000):
        nested = "[" * depth + "]" * depth
        payload = json.dumps(body()).replace('"messages"', f'"metadata": {nested}, "messages"')
        refused(client.post(URL, content=payload, headers={"content-type": "application/json"}),
                None if depth == 5000 else "metadata" + "[0]" * 63, "nested_too_deep")


def test_a_lone_surrogate_is_a_400_naming_the_message() -> None:
    client, engine = make_client()
    payload = json.dumps(body(messages=[{"role": "user", "content": "hi"},
                                        {"role": "user", "content": "\udcff"}]))
    error = refused(client.post(URL, content=payload,
                                headers={"content-type": "application/json"}),
                    "messages[1].content", "invalid_text")
    assert "surrogate" in error["message"]
    assert engine.requests == []


def test_counts_of_messages_and_tools_and_tool_schema_size_are_limited() -> None:
    limits = AdmissionLimits(max_messages=3, max_tools=2, max_tool_schema_bytes=400,
                             max_tool_schema_depth=8)
    client, engine = make_client(limits=limits)
    many = [{"role": "user", "content": str(i)} for i in range(4)]
    assert "at most 3" in refused(client.post(URL, json=body(messages=many)), "messages",
                                  "too_many_messages")["message"]
    tools = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(3)]
    refused(client.post(URL, json=body(tools=tools)), "tools", "too_many_tools")
    wordy = {"type": "function", "function": {"name": "w", "description": "y" * 500}}
    refused(client.post(URL, json=body(tools=[WEATHER, wordy])), "tools[1]",
            "tool_schema_too_large")
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(4):
        deep = {"type": "object", "properties": {"a": deep}}
    assert json_depth({"type": "function", "function": {"name": "d", "parameters": deep}}) > 8
    refused(client.post(URL, json=body(tools=[{"type": "function", "function": {
        "name": "d", "parameters": deep}}])), "tools[0]", "tool_schema_too_deep")
    assert client.post(URL, json=body(tools=[WEATHER])).status_code == 200
    assert len(engine.requests) == 1


def test_prompt_and_max_tokens_must_fit_the_context_before_any_model_work() -> None:
    client, engine = make_client(renderer=CountingRenderer(context_tokens=100))
    long = body(messages=[{"role": "user", "content": "x" * 120}])
    error = refused(client.post(URL, json=long), "messages", "context_length_exceeded")
    assert "120 tokens" in error["message"] and "100 tokens" in error["message"]
    fits = body(messages=[{"role": "user", "content": "x" * 60}])
    refused(client.post(URL, json={**fits, "max_tokens": 50}), "max_tokens",
            "context_length_exceeded")
    assert client.post(URL, json=fits).status_code == 200  # the default shrinks to fit
    assert engine.requests[-1].max_tokens == 40 and len(engine.requests[-1].prompt_ids) == 60


def test_fit_to_context_keeps_an_explicit_max_tokens_that_fits() -> None:
    from deployments.http.schemas import ChatCompletionRequest
    request = ChatRequest("r", MODEL, ({"role": "user", "content": "x"},), max_tokens=30,
                          prompt_ids=(1, 2, 3))
    parsed = ChatCompletionRequest.model_validate(body(max_tokens=30))
    assert fit_to_context(request, parsed, 40).max_tokens == 30


def test_a_replica_that_finds_the_prompt_too_long_answers_400_and_serves_on() -> None:
    class LongPromptEngine(ScriptedChatEngine):
        def open(self, request: ChatRequest, library: Any) -> Any:
            if "long" in request.messages[0]["content"]:
                raise ContextLengthError("the prompt is 40000 tokens; the context holds 32768")
            return super().open(request, library)

    client, _ = make_client(LongPromptEngine(script=fixed(CALL)))
    error = refused(client.post(URL, json=body(messages=[{"role": "user", "content": "long"}])),
                    "messages", "context_length_exceeded")
    assert "32768" in error["message"]
    assert client.post(URL, json=body()).status_code == 200


# ---- fields -------------------------------------------------------------------------------

def test_neutral_values_of_unimplemented_fields_and_bookkeeping_fields_are_accepted() -> None:
    client, engine = make_client()
    response = client.post(URL, json=body(
        logprobs=False, frequency_penalty=0, presence_penalty=0.0, logit_bias={},
        modalities=["text"], metadata={"team": "a"}, store=False, top_k=5,
        stream_options=None))
    assert response.status_code == 200, response.text
    assert engine.requests[-1].top_k == 5


def test_a_call_without_arguments_in_history_is_an_empty_object() -> None:
    client, engine = make_client()
    history = [{"role": "user", "content": "Reset"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "reset", "arguments": ""}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    assert client.post(URL, json=body(messages=history)).status_code == 200
    assert engine.requests[-1].messages[1]["tool_calls"][0]["function"]["arguments"] == {}


@pytest.mark.parametrize("response_format, schema", [
    ({"type": "text"}, None),
    ({"type": "json_object"}, {"type": "object"}),
    ({"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": {
        "type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"]}}},
     {"type": "object", "properties": {"t": {"type": "number"}}, "required": ["t"]}),
])
def test_response_format_reaches_the_engine_as_a_constraint(response_format: dict[str, Any],
                                                            schema: Any) -> None:
    client, engine = make_client(ScriptedChatEngine(script=fixed('{"t": 3}')))
    answer = client.post(URL, json=body(response_format=response_format)).json()
    request = engine.requests[-1]
    assert request.answer_schema == schema and request.constrained is (schema is not None)
    assert answer["choices"][0]["message"]["content"] == '{"t": 3}'


def test_named_choice_allows_one_call_required_as_many_as_parallel_allows() -> None:
    client, engine = make_client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    client.post(URL, json=body(tools=[WEATHER], tool_choice=named))
    assert engine.requests[-1].parallel_calls is False
    client.post(URL, json=body(tools=[WEATHER], tool_choice="required"))
    assert engine.requests[-1].parallel_calls is True
    client.post(URL, json=body(tools=[WEATHER], tool_choice="required",
                               parallel_tool_calls=False))
    assert engine.requests[-1].parallel_calls is False


def test_usage_reports_cached_prompt_tokens() -> None:
    client, _ = make_client()
    usage = client.post(URL, json=body()).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


# ---- failures -----------------------------------------------------------------------------

def test_a_failure_on_the_replica_is_a_500_with_a_request_id_and_no_exception_text() -> None:
    client, _ = make_client(FailingChatEngine(script=fixed(CALL[:10], CALL[10:])))
    boom = body(messages=[{"role": "user", "content": "boom"}])
    response = client.post(URL, json=boom)
    assert response.status_code == 500
    error = response.json()["error"]
    request_id = response.headers["x-request-id"] if "x-request-id" in response.headers else None
    assert "secret" not in response.text and "RuntimeError" not in response.text
    assert error["code"] == "internal_error" and "request id" in error["message"]
    assert request_id is None or request_id in error["message"]
    events = [line for line in client.post(URL, json={**boom, "stream": True}).text.splitlines()
              if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"internal_error"' in events[-2]
    assert "secret" not in "".join(events)
    assert client.post(URL, json=body()).status_code == 200  # the replica serves on


def test_past_the_deadline_a_request_ends_with_504_and_frees_the_replica() -> None:
    engine = ScriptedChatEngine(script=fixed(*CALL), step_s=0.05)
    client, _ = make_client(engine, request_timeout_s=0.3)
    response = client.post(URL, json=body())
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    events = client.post(URL, json=body(stream=True)).text
    assert '"deadline_exceeded"' in events and events.rstrip().endswith("data: [DONE]")
    fast, _ = make_client(ScriptedChatEngine(script=fixed(CALL)), request_timeout_s=5)
    assert fast.post(URL, json=body()).status_code == 200


class BusyClient:
    async def stream(self, request: Any) -> Any:
        raise ReplicaBusyError("queue full", retry_after_s=2.5)
        yield


def test_a_full_queue_is_a_429_with_retry_after() -> None:
    client = TestClient(create_api(BusyClient(), AdmissionPolicy((MODEL,))))
    response = client.post(URL, json=body())
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert response.json()["error"]["type"] == "rate_limit_exceeded"
