"""The Responses API over real HTTP in process (a scripted engine, no model): function tools,
streamed events that agree with the whole response, previous_response_id through a store that
outlives the app, tenants (a user that names its tenant reads and deletes its own responses),
retention, a full store that makes room from the oldest, a response too large for the store
refused before the model runs, the OpenAI SDK reading it, and every bad input a 4xx naming its
field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from serve_fakes import LocalModelClient, ScriptedChatEngine, by_message, fixed

from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.http.tenants import TenantPolicy
from deployments.replica.model_replica import ModelReplica
from deployments.stored_responses.service import LocalResponses
from deployments.stored_responses.store import ResponseStore, StoredResponse

MODEL = "toy-model"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def store(tmp_path: Path) -> ResponseStore:
    opened = ResponseStore(tmp_path / "responses")
    yield opened
    opened.close()


def make_client(store: ResponseStore | None, engine: ScriptedChatEngine | None = None,
                **policy: Any) -> tuple[TestClient, ScriptedChatEngine]:
    engine = engine or ScriptedChatEngine(script=by_message(
        {"sunny": ("It is ", "sunny in Paris.")}, (CALL[:30], CALL[30:])))
    policy.setdefault("tenants", TenantPolicy("default", "x-tenant"))
    api = create_api(LocalModelClient(ModelReplica(engine, name="replica-0")),
                     AdmissionPolicy((MODEL,), **policy),
                     store=LocalResponses(store) if store is not None else None)
    return TestClient(api), engine


def create(client: TestClient, tenant: str = "acme", **fields: Any) -> Any:
    body = {"model": MODEL, "input": "Weather in Paris?", "tools": [WEATHER], **fields}
    return client.post("/v1/responses", json=body, headers={"x-tenant": tenant})


def events_of(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        event = json.loads(lines["data"])
        assert lines["event"] == event["type"]
        events.append(event)
    return events


def test_a_function_call_comes_back_as_a_function_call_item(store: ResponseStore) -> None:
    client, engine = make_client(store)
    response = create(client).json()
    assert response["object"] == "response" and response["status"] == "completed"
    assert response["id"].startswith("resp_")
    [call] = response["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["call_id"].startswith("call_") and call["status"] == "completed"
    usage = response["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert "cached_tokens" in usage["input_tokens_details"]
    request = engine.requests[-1]
    assert request.messages == ({"role": "user", "content": "Weather in Paris?"},)
    assert [tool.name for tool in request.tools] == ["get_weather"]


def test_streamed_events_agree_with_the_whole_response(store: ResponseStore) -> None:
    client, _ = make_client(store)
    whole = create(client).json()
    events = events_of(create(client, stream=True).text)
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    deltas = "".join(e["delta"] for e in events
                     if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert deltas == done["arguments"] == whole["output"][0]["arguments"]
    final = events[-1]["response"]
    assert [(item["name"], item["arguments"]) for item in final["output"]] == \
        [(item["name"], item["arguments"]) for item in whole["output"]]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_text_arrives_as_a_message_with_output_text(store: ResponseStore) -> None:
    client, _ = make_client(store)
    response = create(client, input="Is it sunny?").json()
    [message] = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "output_text", "text": "It is sunny in Paris.",
                                   "annotations": []}]
    events = events_of(create(client, input="Is it sunny?", stream=True).text)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "It is sunny in Paris."
    assert [e["type"] for e in events][2:4] == ["response.output_item.added",
                                                "response.content_part.added"]


def test_the_next_turn_continues_from_the_stored_response(store: ResponseStore) -> None:
    client, engine = make_client(store)
    first = create(client, instructions="Be brief.").json()
    call = first["output"][0]
    second = create(client, previous_response_id=first["id"], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]).json()
    assert second["previous_response_id"] == first["id"]
    assert second["output"][0]["content"][0]["text"] == "It is sunny in Paris."
    messages = engine.requests[-1].messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]  # no instructions
    assert messages[1]["tool_calls"][0]["id"] == call["call_id"]
    assert messages[2] == {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}
    assert client.get(f"/v1/responses/{second['id']}",
                      headers={"x-tenant": "acme"}).json() == second


def test_a_tenant_never_sees_another_tenants_responses(store: ResponseStore) -> None:
    client, _ = make_client(store)
    mine = create(client, tenant="acme").json()
    assert client.get(f"/v1/responses/{mine['id']}", headers={"x-tenant": "other"}
                      ).status_code == 404
    theirs = create(client, tenant="other", previous_response_id=mine["id"], input="and?")
    assert theirs.status_code == 404
    assert theirs.json()["error"]["param"] == "previous_response_id"
    deleted = client.delete(f"/v1/responses/{mine['id']}", headers={"x-tenant": "acme"})
    assert deleted.json() == {"id": mine["id"], "object": "response.deleted", "deleted": True}
    assert client.get(f"/v1/responses/{mine['id']}",
                      headers={"x-tenant": "acme"}).status_code == 404


def test_stored_responses_outlive_the_app_and_store_false_keeps_nothing(tmp_path: Path) -> None:
    first_store = ResponseStore(tmp_path / "r")
    client, _ = make_client(first_store)
    kept = create(client).json()
    not_kept = create(client, store=False).json()
    first_store.close()  # the ingress replica is gone; its file stays
    second_store = ResponseStore(tmp_path / "r")
    client, engine = make_client(second_store)
    assert client.get(f"/v1/responses/{kept['id']}", headers={"x-tenant": "acme"}
                      ).json()["output"] == kept["output"]
    assert client.get(f"/v1/responses/{not_kept['id']}", headers={"x-tenant": "acme"}
                      ).status_code == 404
    follow = create(client, previous_response_id=kept["id"], input="Is it sunny?")
    assert follow.status_code == 200 and len(engine.requests[-1].messages) == 3
    second_store.close()


def test_retention_drops_the_oldest_and_the_expired(tmp_path: Path) -> None:
    now = [1000.0]
    store = ResponseStore(tmp_path / "r", max_age_s=100, max_responses=2,
                          clock=lambda: now[0])

    def put(name: str) -> None:
        store.put(StoredResponse(name, "t", now[0], [], [], {"id": name}))

    put("resp_aaaaaaaa")
    now[0] += 10
    put("resp_bbbbbbbb")
    now[0] += 10
    put("resp_cccccccc")
    assert store.get("t", "resp_aaaaaaaa") is None and store.count() == 2
    now[0] += 95  # bbbbbbbb is 105 s old now, cccccccc 95 s
    assert store.get("t", "resp_bbbbbbbb") is None
    assert store.get("t", "resp_cccccccc") is not None
    store.close()


def test_the_openai_sdk_reads_responses_and_their_stream(store: ResponseStore) -> None:
    http, _ = make_client(store)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)
    response = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                       extra_headers={"x-tenant": "acme"})
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    stream = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                     stream=True, extra_headers={"x-tenant": "acme"})
    kinds = [event.type for event in stream]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds


@pytest.mark.parametrize(("fields", "status", "param"), [
    ({"input": []}, 400, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     400, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "name": "get_weather", "arguments": "{}"}]},
     400, "input[1].call_id"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": "{oops"}]}, 400, "input[1].arguments"),
    ({"input": [{"type": "function_call_output", "output": "sunny"}]}, 400,
     "input[0].call_id"),
    ({"input": 42}, 400, "input"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"tools": [{**WEATHER, "name": "a b/c"}]}, 400, "tools[0].name"),
    ({"tool_choice": {"type": "file_search"}}, 400, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
    ({"max_output_tokens": 100_000}, 400, "max_output_tokens"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "w",
                          "schema": {"type": "string", "format": "stardate"}}}},
     400, "text.format.schema"),
    ({"reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"background": True}, 400, "background"),
    ({"surprise": 1}, 400, "surprise"),
    ({"temperature": -1}, 400, "temperature"),
    ({"previous_response_id": "resp_0000000000000000"}, 404, "previous_response_id"),
    ({"previous_response_id": "../../etc"}, 404, "previous_response_id"),
    ({"model": "gpt-9"}, 404, "model"),
])
def test_bad_inputs_are_4xx_naming_the_responses_field(store: ResponseStore,
                                                       fields: dict[str, Any], status: int,
                                                       param: str) -> None:
    client, _ = make_client(store, max_tokens_limit=2048)
    answer = create(client, **fields)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_an_empty_tool_list_is_no_tools(store: ResponseStore) -> None:
    client, engine = make_client(store)
    answer = create(client, tools=[], input="Is it sunny?")
    assert answer.status_code == 200 and engine.requests[-1].tools is None
    assert answer.json()["tools"] == []


def test_without_a_store_previous_response_id_is_refused_and_answers_still_work() -> None:
    client, _ = make_client(None)
    assert create(client).status_code == 200
    refused = create(client, previous_response_id="resp_0000000000000000")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == \
        "previous_response_id"


def test_a_failure_mid_stream_ends_with_an_error_event_and_response_failed(
        store: ResponseStore) -> None:
    engine = ScriptedChatEngine(script=fixed("never"))
    client, _ = make_client(store, engine=engine, request_timeout_s=0.0001)
    events = events_of(create(client, stream=True).text)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "deadline_exceeded"
    assert events[-1]["response"]["status"] == "failed"


@pytest.mark.parametrize("pieces", [("It is ", "sunny in Pa"),
                                    ("Checking. ", CALL[:30], CALL[30:]), (CALL, CALL[:40])])
def test_an_answer_cut_at_max_output_tokens_is_incomplete_alike_streamed_and_whole(
        store: ResponseStore, pieces: tuple[str, ...]) -> None:
    """The item the cut fell in is ``incomplete``, those before it ``completed``: in the
    whole response, in the stream's closing events, and in the stored response."""
    engine = ScriptedChatEngine(script=fixed(*pieces), finish="length")
    client, _ = make_client(store, engine=engine)
    whole = create(client, max_output_tokens=16).json()
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    statuses = [item["status"] for item in whole["output"]]
    assert statuses == ["completed"] * (len(statuses) - 1) + ["incomplete"]
    events = events_of(create(client, max_output_tokens=16, stream=True).text)
    assert events[-1]["type"] == "response.incomplete"
    assert [item["status"] for item in events[-1]["response"]["output"]] == statuses
    assert [e["item"]["status"] for e in events
            if e["type"] == "response.output_item.done"] == statuses
    kept = client.get(f"/v1/responses/{whole['id']}", headers={"x-tenant": "acme"}).json()
    assert [item["status"] for item in kept["output"]] == statuses


# ---- a full store, and a response too large for it ----------------------------------------

def test_a_full_store_drops_the_oldest_until_each_write_fits(tmp_path: Path) -> None:
    """Far fewer than max_responses fill a small file: each write past that drops the oldest
    until it fits, and a response of the largest size a response may take still fits."""
    now = [1000.0]
    store = ResponseStore(tmp_path / "r", map_bytes=1 << 20, clock=lambda: now[0])
    sizes = [2_000, 15_000, 60_000, 150_000]
    for index in range(120):  # ~7 MB in all, through a 1 MiB file
        store.put(StoredResponse(f"resp_{index:08d}", "t", now[0],
                                 [{"text": "x" * sizes[index % 4]}], [], {"id": index}))
        now[0] += 1
        assert store.get("t", f"resp_{index:08d}") is not None
    assert 3 < store.count() < 60
    assert store.get("t", "resp_00000000") is None  # the oldest went first
    largest = StoredResponse("resp_largest", "t", now[0], [], [], {"text": ""})
    room = store.max_response_bytes - len(store_bytes(largest)) - len(b"t\0resp_largest")
    store.put(StoredResponse("resp_largest", "t", now[0], [], [], {"text": "y" * room}))
    assert store.get("t", "resp_largest").response["text"] == "y" * room
    store.close()


def store_bytes(stored: StoredResponse) -> bytes:
    from deployments.stored_responses.store import encoded

    return encoded(stored)


def test_requests_keep_being_stored_once_the_store_has_filled(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r", map_bytes=1 << 20)
    client, _ = make_client(store)
    long_instructions = "Answer about the weather only. " * 600  # ~19 kB kept per response
    previous = None
    for turn in range(80):
        streamed = turn % 2 == 1
        answer = create(client, instructions=long_instructions, stream=streamed,
                        input=f"Weather in Paris, take {turn}?")
        assert answer.status_code == 200, answer.text
        if streamed:
            events = events_of(answer.text)
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
        else:
            previous = answer.json()["id"]
    kept = client.get(f"/v1/responses/{previous}", headers={"x-tenant": "acme"})
    assert kept.status_code == 200 and kept.json()["instructions"] == long_instructions
    assert store.count() < 80
    store.close()


def test_a_response_too_large_for_the_store_is_refused_before_the_model_runs(
        tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r", map_bytes=1 << 20)  # 256 KiB a response at most
    client, engine = make_client(store)
    large = "a long document to summarise. " * 10_000  # 300 kB
    for streamed in (False, True):
        refused = create(client, input=large, tools=[], stream=streamed)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "store" and error["code"] == "response_too_large"
        assert "store: false" in error["message"]
    assert engine.requests == []  # the model never ran
    assert create(client, input=large, tools=[], store=False).status_code == 200
    store.close()


# ---- tenants named by `user` ----------------------------------------------------------------

def test_a_user_naming_its_tenant_reads_and_deletes_its_own_responses_only(
        store: ResponseStore) -> None:
    client, _ = make_client(store, tenants=TenantPolicy("default", "x-tenant", from_user=True))

    def post(user: str, **fields: Any) -> Any:
        body = {"model": MODEL, "input": "Weather in Paris?", "tools": [WEATHER], "user": user,
                **fields}
        return client.post("/v1/responses", json=body)

    mine = post("alice").json()
    assert store.get("alice", mine["id"]).user == "alice"  # kept under alice, naming her
    read = client.get(f"/v1/responses/{mine['id']}", params={"user": "alice"})
    assert read.status_code == 200 and read.json() == mine
    for other in ({}, {"params": {"user": "bob"}}, {"headers": {"x-tenant": "bob"}},
                  {"params": {"user": "alice"}, "headers": {"x-tenant": "bob"}}):
        missing = client.get(f"/v1/responses/{mine['id']}", **other)  # the header wins
        assert missing.status_code == 404
        assert client.delete(f"/v1/responses/{mine['id']}", **other).status_code == 404
    assert "?user=" in client.get(f"/v1/responses/{mine['id']}").json()["error"]["message"]
    bad = client.get(f"/v1/responses/{mine['id']}", params={"user": "not a tenant"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "user"
    assert post("bob", previous_response_id=mine["id"]).status_code == 404
    assert post("alice", previous_response_id=mine["id"], input="and?").status_code == 200
    deleted = client.delete(f"/v1/responses/{mine['id']}", params={"user": "alice"})
    assert deleted.json() == {"id": mine["id"], "object": "response.deleted", "deleted": True}
    assert client.get(f"/v1/responses/{mine['id']}", params={"user": "alice"}
                      ).status_code == 404
