"""Dataset loaders: every BFCL category used and every NESTFUL split parse, with their counts."""

import json
from pathlib import Path

import pytest

from toolspec.bench.datasets import DatasetFormatError, bfcl, load_dataset, nestful

BFCL_COUNTS = {
    "simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
    "live_simple": 258, "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24,
    "simple_java": 100, "simple_javascript": 50,
}
NESTFUL_COUNTS = {"executable": 85, "sgd": 46, "glaive": 169}


def _bfcl_data() -> Path:
    try:
        return bfcl.data_dir()
    except DatasetFormatError as error:
        pytest.skip(f"bfcl-eval not installed ({error})")


def _nestful_data() -> Path:
    try:
        return nestful.data_dir()
    except DatasetFormatError as error:
        pytest.skip(f"nestful-wrapper not installed ({error})")


@pytest.mark.parametrize("category", list(BFCL_COUNTS))
def test_every_bfcl_category_parses(category: str) -> None:
    _bfcl_data()
    items = load_dataset(f"bfcl:{category}")
    assert len(items) == BFCL_COUNTS[category]
    assert len({item.id for item in items}) == len(items)
    for item in items:
        assert item.messages[-1]["role"] == "user" and item.tools and item.openai_tools
        assert item.answers and len(item.answers) == len(item.reference_calls)
        offered = set(item.tools.names)
        assert all(call["name"] in offered for call in item.reference_calls)
    if category.startswith("parallel") or category.startswith("live_parallel"):
        assert any(len(item.reference_calls) > 1 for item in items)


def test_bfcl_lists_its_categories_and_refuses_multi_turn() -> None:
    _bfcl_data()
    assert bfcl.categories() == list(BFCL_COUNTS)
    with pytest.raises(DatasetFormatError, match="not supported"):
        load_dataset("bfcl:multi_turn_base")


def test_bfcl_nested_acceptable_values_resolve_to_first_choices() -> None:
    truth = [{"f": {"a": [{"x": [1, 2], "y": [""]}], "b": ["", "opt"], "c": [[{"z": [3]}]]}}]
    assert bfcl.reference_calls(truth) == ({"name": "f", "arguments": {
        "a": {"x": 1}, "c": [{"z": 3}]}},)
    assert bfcl.answers(truth) == ({"name": "f", "arguments": truth[0]["f"]},)


def test_java_parameters_become_strings() -> None:
    _bfcl_data()
    item = load_dataset("bfcl:simple_java", 2)[1]
    schema = item.tools.tools[0].parameters["properties"]
    assert {p["type"] for p in schema.values()} == {"string"}
    assert "Java" in schema["params"]["description"]


@pytest.mark.parametrize("split", list(NESTFUL_COUNTS))
def test_every_nestful_split_parses(split: str) -> None:
    _nestful_data()
    items = load_dataset(f"nestful:{split}")
    assert len(items) == NESTFUL_COUNTS[split]
    for item in items:
        assert item.ordered and item.reference_calls
        assert all(call["name"] != nestful.RESULT for call in item.reference_calls)
        assert {call["name"] for call in item.reference_calls} == set(item.tools.names)


def test_nestful_file_relabels_calls_and_uses_its_spec(tmp_path: Path) -> None:
    spec = [{"name": "find", "description": "Find a place.",
             "query_parameters": {"query": {"description": "what", "required": True,
                                            "allowed_values": []},
                                  "kind": {"type": "Date (yyyy-mm-dd)", "required": False}}},
            {"name": "book", "query_parameters": {"id": {"type": "string", "required": True}}}]
    data = [{"input": " Find and book it. ", "output": [
        {"name": "find", "arguments": {"query": "x"}, "label": "var3"},
        {"name": "book", "arguments": {"id": "$var3.id$"}, "label": "var7"},
        {"name": "var_result", "arguments": {"r": "$var7$"}}]}]
    (tmp_path / "toy-data.json").write_text(json.dumps(data))
    (tmp_path / "toy-spec.json").write_text(json.dumps(spec))
    item, = load_dataset(f"nestful:{tmp_path / 'toy-data.json'}")
    assert item.id == "toy-0" and item.messages[-1]["content"] == "Find and book it."
    assert item.reference_calls == ({"name": "find", "arguments": {"query": "x"}},
                                     {"name": "book", "arguments": {"id": "$var1.id$"}})
    find = item.tools.get("find")
    assert find.required == ("query",) and "type" not in find.properties["kind"]
    with pytest.raises(DatasetFormatError, match="split"):
        load_dataset("nestful:unknown")


def test_a_users_requests_load_as_items_with_their_tools_and_expected_calls(tmp_path) -> None:
    from toolspec.bench.datasets import load_dataset

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    lines = [
        {"model": "any", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
         "tools": [weather], "reference_calls": [{"name": "get_weather",
                                                  "arguments": {"city": "Oslo"}}]},
        {"id": "second", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
         "tools": [weather], "expected": {"tool_calls": [{"function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}},
    ]
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    first, second = load_dataset(str(path))
    assert first.id == "traffic-1" and first.tools.names == ("get_weather",)
    assert first.openai_tools[0]["function"]["name"] == "get_weather"
    assert first.reference_calls == ({"name": "get_weather", "arguments": {"city": "Oslo"}},)
    assert second.id == "second" and second.messages[0]["content"] == "And Rome?"
    assert second.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"}
    assert second.reference_calls == ({"name": "get_weather", "arguments": {"city": "Paris"}},)
    assert [item.id for item in load_dataset(str(path), skip=1)] == ["second"]
    path.write_text('{"messages": "no"}\n')
    with pytest.raises(DatasetFormatError, match="traffic.jsonl:1"):
        load_dataset(str(path))


def test_the_api_bank_sets_ship_with_the_package() -> None:
    from toolspec.bench.datasets import apibank_file

    level_1 = load_dataset("apibank:level-1")
    level_2 = load_dataset("apibank:level-2", limit=3, skip=1)
    assert len(level_1) == 399 and len(level_2) == 3
    assert level_1[0].reference_calls and level_1[0].tools
    assert apibank_file("apibank:level-2").is_file()
    assert apibank_file("some/file.json").as_posix() == "some/file.json"
    with pytest.raises(DatasetFormatError, match="apibank:level-1, apibank:level-2"):
        load_dataset("apibank:level-3")
