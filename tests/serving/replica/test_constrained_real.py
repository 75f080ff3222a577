"""Constrained modes on real weights, through the served API: ``required`` and named choice
end where the model ends (one call, ``finish_reason`` tool_calls — issue: they used to repeat
the call until the token limit), ``response_format`` answers follow their schema, and
speculative decoding gives exactly the plain (masked) decoding output. fp32: bitwise."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from serve_fakes import LocalModelClient

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.messages import ChatRequest
from deployments.replica.engine import EngineSettings
from deployments.replica.model_replica import ModelReplica
from deployments.replica.toolspec_engine import ToolSpecChatEngine
from toolspec.core.drafter import Drafter, NoDrafter
from toolspec.library import CallLibrary

pytestmark = pytest.mark.real_model

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                          "parameters": {"type": "object", "properties": {}}}}
ASK_WEATHER = ("The weather in San Francisco. The weather in San Francisco. What is the weather "
               "in San Francisco? Use the get_weather tool for San Francisco.")
ASK_TIME = "What time is it? Use the get_time tool."
CASES = [(WEATHER, ASK_WEATHER), (CLOCK, ASK_TIME)]


class PlainChatEngine(ToolSpecChatEngine):
    """The served engine with drafting turned off: plain (masked) decoding."""

    def _drafter(self, request: ChatRequest, library: CallLibrary | None) -> Drafter:
        return NoDrafter()


def api(engine: ToolSpecChatEngine, name: str) -> TestClient:
    return TestClient(create_api(LocalModelClient(ModelReplica(engine, name=name)),
                                 AdmissionPolicy((engine.settings.model,), max_tokens_limit=4096)))


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2-135m"])
def clients(request: pytest.FixtureRequest) -> tuple[TestClient, TestClient, str]:
    settings = EngineSettings(model=request.param, dtype="fp32", draft_budget=8)
    speculative = ToolSpecChatEngine(settings)
    plain = PlainChatEngine.__new__(PlainChatEngine)
    plain.__dict__.update(speculative.__dict__)  # the same loaded model, no drafts
    return api(speculative, "speculative"), api(plain, "plain"), request.param


def ask(client: TestClient, model: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"model": model, "max_tokens": 128,
                                                         **fields})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_end_after_one_call_like_the_model(clients, case: int, choice: str) -> None:
    speculative, plain, model = clients
    tool, text = CASES[case]
    name = tool["function"]["name"]
    tool_choice = "required" if choice == "required" else {
        "type": "function", "function": {"name": name}}
    fields = {"messages": [{"role": "user", "content": text}], "tools": [tool],
              "tool_choice": tool_choice}
    answers = [ask(client, model, **fields) for client in (plain, speculative)]
    for answer in answers:
        choice_body = answer["choices"][0]
        assert choice_body["finish_reason"] == "tool_calls", choice_body
        calls = choice_body["message"]["tool_calls"]
        assert [call["function"]["name"] for call in calls] == [name]
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]),
                            tool["function"]["parameters"])
        assert answer["usage"]["completion_tokens"] < 40
        assert answer["toolspec"]["constrained"] is True
    assert [call["function"] for call in answers[0]["choices"][0]["message"]["tool_calls"]] \
        == [call["function"] for call in answers[1]["choices"][0]["message"]["tool_calls"]]
    # The same token counts (the second may take the first's prompt from the prefix cache).
    counts = [{k: v for k, v in answer["usage"].items() if k != "prompt_tokens_details"}
              for answer in answers]
    assert counts[0] == counts[1]


def test_auto_is_one_call_too_on_the_tool_caller(clients) -> None:
    speculative, _, model = clients
    if model != "qwen2.5-coder-0.5b":
        pytest.skip("SmolLM2 is not a tool caller: under auto it answers in prose")
    answer = ask(speculative, model, messages=[{"role": "user", "content": ASK_WEATHER}],
                 tools=[WEATHER])
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert len(answer["choices"][0]["message"]["tool_calls"]) == 1


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "temperature_c": {"type": "number"}},
          "required": ["city", "temperature_c"]}


@pytest.mark.parametrize("response_format", [
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": SCHEMA}},
])
def test_response_format_answers_follow_the_schema_with_and_without_drafts(
        clients, response_format: dict[str, Any]) -> None:
    speculative, plain, model = clients
    fields = {"messages": [{"role": "user", "content": "Give the weather in Oslo as JSON with "
                                                       "the city and temperature_c."}],
              "response_format": response_format, "max_tokens": 80}
    answers = [ask(client, model, **fields) for client in (plain, speculative)]
    content = answers[0]["choices"][0]["message"]["content"]
    assert answers[1]["choices"][0]["message"]["content"] == content
    if answers[0]["choices"][0]["finish_reason"] == "stop":
        document = json.loads(content)
        if response_format["type"] == "json_schema":
            jsonschema.validate(document, SCHEMA)
        else:
            assert isinstance(document, dict)
