"""The OpenAI-compatible API over a scripted engine (no Ray, no model): responses, streaming
tool-call deltas when one step emits many tokens, tool_choice, and every admission error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serve_fakes import LocalModelClient, ScriptedChatEngine, fixed

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.messages import ReplicaUnavailableError, StreamStart
from deployments.replica.model_replica import ModelReplica

MODEL = "toy-model"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}}}}
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
             '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
             '</tool_call>')


def make_client(engine: ScriptedChatEngine, max_tokens_limit: int = 2048,
                **policy: Any) -> TestClient:
    api = create_api(LocalModelClient(ModelReplica(engine, name="replica-0")),
                     AdmissionPolicy((MODEL,), max_tokens_limit=max_tokens_limit, **policy))
    return TestClient(api)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            **fields}


def sse_events(response: Any) -> list[Any]:
    events = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def streamed_calls(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            for fragment in choice["delta"].get("tool_calls", []):
                call = calls.setdefault(fragment["index"], {"fragments": 0, "arguments": ""})
                if call["fragments"] == 0:
                    call["name"] = fragment["function"]["name"]
                    call["id"] = fragment["id"]
                else:
                    assert "name" not in fragment["function"] and "id" not in fragment
                call["fragments"] += 1
                call["arguments"] += fragment["function"]["arguments"]
    return calls


# ---- responses ----------------------------------------------------------------------------

@pytest.mark.parametrize("pieces", [
    (TWO_CALLS,),  # one step emits both calls whole
    (TWO_CALLS[:5], TWO_CALLS[5:47], TWO_CALLS[47:120], TWO_CALLS[120:]),
    tuple(TWO_CALLS),  # one character per step
])
def test_tool_calls_plain_and_streamed_agree_however_steps_split(pieces: tuple[str, ...]) -> None:
    client = make_client(ScriptedChatEngine(script=fixed(*pieces)))
    plain = client.post("/v1/chat/completions", json=body(tools=[WEATHER, TIME])).json()
    choice = plain["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "c"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"zone": "CET"}
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)
    assert plain["usage"]["completion_tokens"] == len(TWO_CALLS)
    assert plain["toolspec"]["steps"] == len(pieces) - 1

    response = client.post("/v1/chat/completions", json=body(tools=[WEATHER, TIME], stream=True))
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("tool_calls") == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # One tool-call fragment per chunk, even when one step finishes a call and starts the next.
    assert all(len(c["choices"][0]["delta"].get("tool_calls", ())) <= 1 for c in chunks)
    streamed = streamed_calls(chunks)
    assert [streamed[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    for i in (0, 1):
        assert streamed[i]["arguments"] == calls[i]["function"]["arguments"]
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)


def test_prose_before_a_call_is_content_without_the_wrapper() -> None:
    output = ('Let me check that.\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    client = make_client(ScriptedChatEngine(script=fixed(output[:10], output[10:30], output[30:])))
    message = client.post("/v1/chat/completions",
                          json=body(tools=[WEATHER])).json()["choices"][0]["message"]
    assert message["content"] == "Let me check that.\n"
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    chunks = sse_events(client.post("/v1/chat/completions",
                                    json=body(tools=[WEATHER], stream=True)))[:-1]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "Let me check that.\n"


def test_fenced_block_of_calls_as_api_bank_writes_them() -> None:
    output = ('```<tool_call>\n{"name": "get_weather", "parameters": {"city": "Rome"}}\n'
              '{"name": "get_time", "parameters": {"zone": "CET"}}\n</tool_call>\n```')
    client = make_client(ScriptedChatEngine(script=fixed(output), call_format="apibank"))
    message = client.post("/v1/chat/completions",
                          json=body(tools=[WEATHER, TIME])).json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert message["content"] is None


def test_text_answer_streams_as_content_and_ends_with_stop() -> None:
    client = make_client(ScriptedChatEngine(script=fixed("It is ", "sunny {mostly}", ".")))
    plain = client.post("/v1/chat/completions", json=body()).json()
    assert plain["choices"][0]["message"] == {"role": "assistant",
                                              "content": "It is sunny {mostly}."}
    assert plain["choices"][0]["finish_reason"] == "stop"
    events = sse_events(client.post("/v1/chat/completions", json=body(
        stream=True, tools=[WEATHER], stream_options={"include_usage": True})))
    chunks = events[:-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) \
        == "It is sunny {mostly}."
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 21


def test_token_limit_gives_finish_reason_length() -> None:
    engine = ScriptedChatEngine(script=fixed('<tool_call>\n{"name": "get_weather", "argu'),
                                finish="length")
    choice = make_client(engine).post("/v1/chat/completions",
                                      json=body(tools=[WEATHER])).json()["choices"][0]
    assert choice["finish_reason"] == "length"


def test_toolspec_extension_reports_speculation() -> None:
    client = make_client(ScriptedChatEngine(script=fixed("a", "bcd", "efgh")))
    extension = client.post("/v1/chat/completions", json=body()).json()["toolspec"]
    assert extension["steps"] == 2 and extension["mat"] == pytest.approx(3.5)
    assert extension["accepted_by_source"] == {"schema": 5}
    assert "replica" not in extension  # only when the deployment says so
    debug = make_client(ScriptedChatEngine(), expose_replica=True)
    assert debug.post("/v1/chat/completions", json=body()).json()["toolspec"]["replica"] \
        == "replica-0"


# ---- tool_choice and sessions -------------------------------------------------------------

def test_tool_choice_none_offers_no_tools_and_reads_no_calls() -> None:
    engine = ScriptedChatEngine(script=fixed(TWO_CALLS))
    message = make_client(engine).post("/v1/chat/completions", json=body(
        tools=[WEATHER], tool_choice="none")).json()["choices"][0]["message"]
    assert engine.requests[-1].tools is None and engine.requests[-1].openai_tools == ()
    assert message["content"] == TWO_CALLS and "tool_calls" not in message


def test_named_tool_choice_offers_only_that_tool() -> None:
    engine = ScriptedChatEngine(script=fixed(TWO_CALLS))
    make_client(engine).post("/v1/chat/completions", json=body(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}))
    request = engine.requests[-1]
    assert request.tool_choice == "named" and request.named_tool == "get_time"
    assert request.tools.names == ("get_time",)


def test_required_and_parallel_flags_reach_the_engine() -> None:
    engine = ScriptedChatEngine(script=fixed(TWO_CALLS))
    make_client(engine).post("/v1/chat/completions", json=body(
        tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, temperature=0.7,
        top_p=0.9, seed=3, stop=["###"], max_tokens=17))
    request = engine.requests[-1]
    assert (request.tool_choice, request.parallel_tool_calls) == ("required", False)
    assert (request.temperature, request.top_p, request.seed, request.stop, request.max_tokens) \
        == (0.7, 0.9, 3, ("###",), 17)


@pytest.mark.parametrize("fields, constrained, strict", [
    ({}, False, False),
    ({"tool_choice": "required"}, True, False),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, True, False),
    ({"strict": True}, True, True),
    ({"tools": [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]},
     True, True),
    ({"tool_choice": "none", "strict": True}, False, False),
])
def test_required_named_and_strict_constrain_decoding_auto_does_not(
        fields: dict[str, Any], constrained: bool, strict: bool) -> None:
    engine = ScriptedChatEngine(script=fixed(TWO_CALLS))
    answer = make_client(engine).post("/v1/chat/completions",
                                      json=body(**{"tools": [WEATHER], **fields})).json()
    request = engine.requests[-1]
    assert (request.constrained, request.strict) == (constrained, strict)
    assert answer["toolspec"]["constrained"] is constrained


UNENFORCEABLE = {"type": "function", "function": {"name": "when", "parameters": {
    "type": "object", "properties": {"at": {"type": "string", "format": "stardate"}}}}}


def test_schemas_constrained_decoding_cannot_enforce_are_refused_only_when_constrained() -> None:
    engine = ScriptedChatEngine()
    client = make_client(engine)
    assert client.post("/v1/chat/completions", json=body(tools=[UNENFORCEABLE])).status_code == 200
    for fields in ({"tool_choice": "required"}, {"strict": True}):
        response = client.post("/v1/chat/completions", json=body(tools=[UNENFORCEABLE], **fields))
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("tools", "unsupported_tool_schema")
        assert "'when'" in error["message"] and "stardate" in error["message"]
    assert len(engine.requests) == 1


def test_session_id_from_header_else_user() -> None:
    engine = ScriptedChatEngine()
    client = make_client(engine)
    client.post("/v1/chat/completions", json=body(user="alice"), headers={"x-session-id": "s-1"})
    assert engine.requests[-1].session_id == "s-1"
    client.post("/v1/chat/completions", json=body(user="alice"))
    assert engine.requests[-1].session_id == "alice"


# ---- errors -------------------------------------------------------------------------------

BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("payload, status, param", [
    ("{not json", 400, None),
    ("[1, 2]", 400, None),
    (json.dumps({"model": MODEL}), 400, "messages"),
    (json.dumps(body(model="gpt-9")), 404, "model"),
    (json.dumps(body(tools=[BAD_TOOL])), 400, "tools"),
    (json.dumps(body(tools=[{"type": "function"}])), 400, "tools"),
    (json.dumps(body(tools=[])), 400, "tools"),
    (json.dumps(body(tools=[WEATHER, WEATHER])), 400, "tools"),
    (json.dumps(body(tools=[{"type": "function", "function": {**WEATHER["function"],
                                                               "strict": "yes"}}])), 400, "tools"),
    (json.dumps(body(tools=[{"type": "function", "function": {**WEATHER["function"],
                                                               "name": "a b/c"}}])),
     400, "tools[0].function.name"),
    (json.dumps(body(tools=[WEATHER, {"type": "function", "function": {
        **WEATHER["function"], "name": "x" * 65}}])), 400, "tools[1].function.name"),
    (json.dumps(body(tools=[WEATHER], tool_choice="sometimes")), 400, "tool_choice"),
    (json.dumps(body(tools=[WEATHER], tool_choice={"type": "function",
                                                   "function": {"name": "nope"}})),
     400, "tool_choice"),
    (json.dumps(body(tool_choice="required")), 400, "tool_choice"),
    (json.dumps(body(tool_choice="auto")), 400, "tool_choice"),
    (json.dumps(body(tool_choice=NAMED)), 400, "tool_choice"),
    (json.dumps(body(n=2)), 400, "n"),
    (json.dumps(body(max_tokens=100_000)), 400, "max_tokens"),
    (json.dumps(body(max_completion_tokens=100_000)), 400, "max_completion_tokens"),
    (json.dumps(body(max_tokens=0)), 400, "max_tokens"),
    (json.dumps(body(temperature=-3)), 400, "temperature"),
    (json.dumps(body(stop=["a", ""])), 400, "stop"),
    (json.dumps(body(messages=[{"role": "wizard", "content": "hi"}])), 400, "messages[0].role"),
    (json.dumps(body(messages=[{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])),
     400, "messages[0].tool_calls[0].function.arguments"),
    (json.dumps(body(messages=[{"role": "user", "content": "hi"},
                               {"role": "tool", "content": "sunny"}])),
     400, "messages[1].tool_call_id"),
    (json.dumps(body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}])),
     400, "messages[0].content[0]"),
    (json.dumps(body(logprobs=True)), 400, "logprobs"),
    (json.dumps(body(logit_bias={"42": 5})), 400, "logit_bias"),
    (json.dumps(body(presence_penalty=0.5)), 400, "presence_penalty"),
    (json.dumps(body(functions=[WEATHER["function"]])), 400, "functions"),
    (json.dumps(body(best_of=3)), 400, "best_of"),
    (json.dumps(body(response_format={"type": "xml"})), 400, "response_format.type"),
    (json.dumps(body(response_format={"type": "json_schema"})), 400,
     "response_format.json_schema"),
    (json.dumps(body(response_format={"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "string", "format": "stardate"}}})), 400,
     "response_format.json_schema.schema"),
])
def test_admission_errors_are_openai_error_objects(payload: str, status: int,
                                                   param: str | None) -> None:
    engine = ScriptedChatEngine()
    response = make_client(engine).post("/v1/chat/completions", content=payload,
                                        headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert engine.requests == []  # refused before any replica saw it


class DownClient:
    async def stream(self, request: Any) -> Any:
        raise ReplicaUnavailableError("replica died")
        yield  # an async generator that fails on first use

    async def describe(self) -> dict[str, Any]:
        raise ReplicaUnavailableError("replica died")

    async def deployments(self) -> None:
        return None


def test_unavailable_replica_is_a_503_error_object_in_both_modes() -> None:
    client = TestClient(create_api(DownClient(), AdmissionPolicy((MODEL,))))
    response = client.post("/v1/chat/completions", json=body())
    assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable"
    events = sse_events(client.post("/v1/chat/completions", json=body(stream=True)))
    assert events[0]["error"]["code"] == "replica_unavailable" and events[-1] == "[DONE]"


def test_models_health_and_unknown_routes() -> None:
    client = make_client(ScriptedChatEngine())
    health = client.get("/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "library": "disabled", "model": {
        "model": "toy-model", "dtype": "float32", "context_tokens": 4096}}
    listed = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [MODEL]
    assert listed[0]["root"] == "toy-model" and listed[0]["max_model_len"] == 4096
    down = TestClient(create_api(DownClient(), AdmissionPolicy((MODEL,))))
    assert down.get("/health").status_code == 503
    assert down.get("/health").json()["status"] == "unavailable"
    assert [m["id"] for m in down.get("/v1/models").json()["data"]] == [MODEL]
    missing = client.get("/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json()


class FlakyClient:
    """The first ``failures`` requests find their replica dead; later ones are answered by
    ``replica``. Records the requests it was given."""

    def __init__(self, replica: ModelReplica, failures: int) -> None:
        self.local = LocalModelClient(replica)
        self.failures = failures
        self.requests: list[Any] = []

    async def stream(self, request: Any) -> Any:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            yield StreamStart("hermes", 11, "replica-0")
            raise ReplicaUnavailableError("RayActorError: the actor died unexpectedly")
        async for event in self.local.stream(request):
            yield event

    async def describe(self) -> dict[str, Any]:
        return await self.local.describe()

    async def deployments(self) -> None:
        return None


def test_a_request_whose_replica_dies_is_retried_once_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deployments.http.answer.RETRY_PAUSE_S", 0.0)
    flaky = FlakyClient(ModelReplica(ScriptedChatEngine(), name="replica-1"), failures=1)
    client = TestClient(create_api(flaky, AdmissionPolicy((MODEL,))))
    response = client.post("/v1/chat/completions", json=body(),
                           headers={"x-session-id": "s-1"})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]
    assert [r.session_id for r in flaky.requests] == ["s-1", None]  # its KV died with it
    twice = FlakyClient(ModelReplica(ScriptedChatEngine(), name="replica-1"), failures=2)
    client = TestClient(create_api(twice, AdmissionPolicy((MODEL,))))
    response = client.post("/v1/chat/completions", json=body())
    assert response.status_code == 503 and len(twice.requests) == 2  # once, not forever
    streamed = FlakyClient(ModelReplica(ScriptedChatEngine(), name="replica-1"), failures=1)
    client = TestClient(create_api(streamed, AdmissionPolicy((MODEL,))))
    events = sse_events(client.post("/v1/chat/completions", json=body(stream=True)))
    assert events[-2]["error"]["code"] == "replica_unavailable" and events[-1] == "[DONE]"
    assert len(streamed.requests) == 1  # a stream already sent its start: no retry
