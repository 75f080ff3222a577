import pytest

from toolspec.calls.formats import (
    COMPACT_STYLE,
    FORMATS,
    CallState,
    ToolCall,
    UnknownFormatError,
    detect_format,
    get_format,
)

CALLS = [ToolCall("get_weather", {"city": "Paris", "days": 3}),
         ToolCall("book", {"note": 'say "hi"\\n', "ok": True, "tags": ["a", {"b": None}]})]


@pytest.mark.parametrize("name", list(FORMATS))
def test_render_then_parse_round_trips(name: str) -> None:
    fmt = get_format(name)
    for style in (None, COMPACT_STYLE):
        text = fmt.render(CALLS) if style is None else fmt.render(CALLS, style)
        assert fmt.parse(text) == CALLS


def test_canonical_renderings() -> None:
    one = [ToolCall("f", {"a": 1})]
    assert get_format("hermes").render(one) == (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    assert get_format("apibank").render(one) == (
        '```<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>\n```')
    assert get_format("llama3_json").render(one) == '{"name": "f", "parameters": {"a": 1}}'
    assert get_format("json").render(one, COMPACT_STYLE) == '{"name":"f","arguments":{"a":1}}'


def test_json_format_accepts_fences_prose_and_lists() -> None:
    fmt = get_format("json")
    fenced = 'Sure!\n```json\n{"name": "f", "arguments": {"a": 1}}\n```'
    assert fmt.parse(fenced) == [ToolCall("f", {"a": 1})]
    listed = '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": "y"}}]'
    assert fmt.parse(listed) == [ToolCall("f", {}), ToolCall("g", {"x": "y"})]
    assert fmt.parse("see [1] and {not json} then") == []


def test_detection() -> None:
    assert detect_format(
        'Output ```<tool_call>\n{"name": ..., "parameters": ...}').name == "apibank"
    assert detect_format("<tools>...</tools> <tool_call>").name == "hermes"
    assert detect_format("plain",
                         chat_template="{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert detect_format("plain", chat_template="ipython").name == "llama3_json"
    assert detect_format("plain").name == "json"
    with pytest.raises(UnknownFormatError, match="available"):
        get_format("xml")


def states(text: str, fmt: str = "hermes") -> list[str]:
    """The scanner state after each character, with consecutive repeats collapsed."""
    scanner = get_format(fmt).scanner()
    seen: list[str] = []
    for char in text:
        scanner.feed(char)
        if not seen or seen[-1] != scanner.state.value:
            seen.append(scanner.state.value)
    return seen


def test_state_sequence_of_a_call_with_every_value_kind() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "f", "arguments": {"s": "a\\"b", "n": -1.5e3, '
            '"b": false, "z": null, "o": {"k": [1, 2]}}}\n</tool_call>')
    assert states(text) == [
        "text", "call_start", "call_key", "call_colon", "tool_name", "after_name", "call_start",
        "call_key", "call_colon", "args_start", "param_name", "param_colon", "value_string",
        "after_value", "args_start", "param_name", "param_colon", "value_literal", "args_start",
        "param_name", "param_colon", "value_literal", "args_start", "param_name", "param_colon",
        "value_literal", "args_start", "param_name", "param_colon", "value_nested", "after_value",
        "after_args", "text",
    ]


def test_two_and_parallel_calls_are_each_recognised() -> None:
    fmt = get_format("apibank")
    text = fmt.render([ToolCall("a", {"x": 1}), ToolCall("b", {})])
    scanner = fmt.scanner()
    scanner.feed(text[: text.index('"b"') + 2])
    assert scanner.state is CallState.TOOL_NAME and len(scanner.calls) == 1
    assert scanner.partial == "b"
    scanner.feed(text[text.index('"b"') + 2:])
    assert [c.name for c in scanner.calls] == ["a", "b"] and scanner.state is CallState.TEXT


def test_scanner_tracks_tool_parameters_and_partial_strings() -> None:
    scanner = get_format("hermes").scanner()
    scanner.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert scanner.state is CallState.VALUE_STRING
    assert scanner.tool_name == "get_weather"
    assert scanner.parameter == "city" and scanner.given_parameters == ("city",)
    assert scanner.partial == "Par"
    assert scanner.text[scanner.anchor:] == ': "Par'


def test_unicode_and_escapes_in_values() -> None:
    fmt = get_format("hermes")
    call = ToolCall("t", {"q": "naïve café \u2603 \"quoted\" \\ back"})
    assert fmt.parse(fmt.render([call])) == [call]
    scanner = fmt.scanner()
    scanner.feed('{"name": "t", "arguments": {"q": "\\u00e9')
    assert scanner.partial == "é"


def test_empty_arguments_and_malformed_output() -> None:
    fmt = get_format("hermes")
    assert (fmt.parse('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
            == [ToolCall("f", {})])
    scanner = fmt.scanner()
    scanner.feed('<tool_call>\n{"name": "f", "arguments": {"a": oops')
    assert scanner.state is CallState.TEXT  # off-format: the object is abandoned
    scanner.feed(' and then {"name": "g", "arguments": {"b": 2}}')
    assert [c.name for c in scanner.calls] == ["g"]
    assert fmt.parse('{"name": 3, "arguments": {}}') == []


# Outputs recorded from the default model (qwen2.5-coder-0.5b) on API-Bank level-1 prompts.
REAL_OUTPUTS = [
    '{"name": "EmergencyKnowledge", "parameters": {"symptom": "shortness of breath"}}',
    '{"name": "AppointmentRegistration", "parameters": {"patient_name": "Emily Smith", '
    '"date": "2023-10-15", "doctor_name": "Dr. John"}}',
    '```<tool_call>\n{"name": "GetUserToken", "parameters": {"username": "JohnDoe", '
    '"password": "pass123"}}\n</tool_call>\n```',
]


def test_state_sequences_of_real_model_outputs() -> None:
    bare = ["call_start", "call_key", "call_colon", "tool_name", "after_name", "call_start",
            "call_key", "call_colon", "args_start", "param_name", "param_colon", "value_string",
            "after_value"]
    assert states(REAL_OUTPUTS[0], "apibank") == [*bare, "after_args", "text"]
    three_params = states(REAL_OUTPUTS[1], "apibank")
    assert three_params.count("param_name") == 3 and three_params.count("value_string") == 3
    assert states(REAL_OUTPUTS[2], "apibank")[:2] == ["text", "call_start"]
    parsed = [get_format("apibank").parse(text) for text in REAL_OUTPUTS]
    assert parsed[1] == [ToolCall("AppointmentRegistration", {
        "patient_name": "Emily Smith", "date": "2023-10-15", "doctor_name": "Dr. John"})]
    assert parsed[2] == [ToolCall("GetUserToken", {"username": "JohnDoe", "password": "pass123"})]


def test_qwen_coder_style_fenced_json_with_preamble() -> None:
    text = ('I will look that up.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n```')
    assert get_format("json").parse(text) == [ToolCall("get_weather", {"city": "Paris"})]
    assert states(text, "json")[0] == "text" and states(text, "json")[-1] == "text"


def test_indented_style_gaps_match_json_dumps() -> None:
    from toolspec.calls.formats import INDENTED_STYLE as style

    call = {"name": "f", "arguments": {"a": 1, "b": "x"}}
    expected = (style.opening_gap(1) + '"name": "f"' + style.separator(1) + '"arguments": {'
                + style.opening_gap(2) + '"a": 1' + style.separator(2) + '"b": "x"'
                + style.closing_gap(2) + "}" + style.closing_gap(1) + "}")
    assert "{" + expected == style.dumps(call)
    assert get_format("hermes").parse(
        get_format("hermes").render([ToolCall("f", {"a": 1})], style)) == [ToolCall("f", {"a": 1})]
