import pytest

from toolspec.bench.datasets import load_apibank, sample_path
from toolspec.calls.tools import ToolSchemaError, ToolSet

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}


def test_openai_tools_are_validated_and_ordered() -> None:
    tools = ToolSet.from_openai([WEATHER])
    tool = tools.get("get_weather")
    assert tools.names == ("get_weather",)
    assert tool.required == ("city",)
    assert tool.parameter_order() == ("city", "unit", "days")
    assert tool.openai()["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}},
         "tool 'f': invalid parameters schema"),
        ({"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
         "must be an object schema"),
        ({"type": "function", "function": {"description": "no name"}}, "function.name"),
        ({"type": "retrieval"}, "only type 'function'"),
        ({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "minLength": -1}}}}},
         "properties/x/minLength"),
    ],
)
def test_bad_tools_name_the_tool_and_the_problem(entry, message) -> None:
    with pytest.raises(ToolSchemaError, match=message):
        ToolSet.from_openai([entry])


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ToolSchemaError, match="repeated: get_weather"):
        ToolSet.from_openai([WEATHER, WEATHER])


def test_bfcl_style_dict_type_is_normalized() -> None:
    tools = ToolSet.from_functions([{"name": "area", "parameters": {
        "type": "dict", "properties": {"base": {"type": "float"},
                                       "tags": {"type": "tuple", "items": {"type": "str"}}},
        "required": ["base"]}}])
    schema = tools.get("area").parameters
    assert schema["type"] == "object"
    assert schema["properties"]["base"]["type"] == "number"
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}


def test_apibank_system_prompt_parses_into_schemas() -> None:
    item = load_apibank(sample_path())[0]
    tools = ToolSet.from_apibank_prompt(item.messages[0]["content"])
    assert tools.names == ("QueryHealthData", "CancelRegistration", "ModifyRegistration")
    modify = tools.get("ModifyRegistration")
    assert modify.parameter_order() == (
        "appointment_id", "new_appointment_date", "new_appointment_doctor")
    assert modify.properties["appointment_id"]["type"] == "string"
    assert item.tools == tools


def test_apibank_types_map_to_json_schema() -> None:
    prompt = ("1. Name: T\nDescription: d\nParameters: {'a': {'type': 'int', 'description': 'x'}, "
              "'b': {'type': 'list(str)', 'description': 'y'}, 'c': {'type': 'bool'}}\n")
    schema = ToolSet.from_apibank_prompt(prompt).get("T").parameters
    assert schema["properties"]["a"] == {"type": "integer", "description": "x"}
    assert schema["properties"]["b"]["items"] == {"type": "string"}
    assert schema["properties"]["c"] == {"type": "boolean"}
    with pytest.raises(ToolSchemaError, match="tool 'T'"):
        ToolSet.from_apibank_prompt("1. Name: T\nParameters: {'a': \n")
