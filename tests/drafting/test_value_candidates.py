"""Argument values the call grammar drafts from the conversation and the prompt (pure text)."""

import pytest

from toolspec.calls.formats import (
    COMPACT_STYLE,
    DEFAULT_STYLE,
    INDENTED_STYLE,
    JsonStyle,
    get_format,
)
from toolspec.calls.tools import ToolSet
from toolspec.drafting import prompt_literals
from toolspec.drafting.call_grammar import CallGrammar
from toolspec.drafting.conversation_values import value_like_spans
from toolspec.drafting.date_values import DateValue, complete_in_pattern
from toolspec.drafting.prompt_literals import NestedLiteral, nested_literals
from toolspec.drafting.text_drafts import LITERAL, PATTERN

DATE_TIME = "%Y-%m-%d %H:%M:%S"


def drafts_from(calls: CallGrammar, output: str, source: str | None = None,
                style: JsonStyle = DEFAULT_STYLE) -> list[str]:
    """The grammar's continuations of ``output`` (texts after what is typed), best first;
    only those with a segment from ``source`` when it is given."""
    scanner = calls.format.scanner()
    scanner.feed(output)
    typed = scanner.text[scanner.anchor:]
    ranked = []
    for draft in calls.continuations(scanner, [(style, 1.0)]):
        rest = draft.after(typed)
        if rest is None or not rest.text:
            continue
        if source is None or any(s.source == source for s in rest.segments):
            ranked.append(rest)
    return [rest.text for rest in sorted(ranked, key=lambda rest: -rest.probability)]


def one_tool(properties: dict, conversation: str = "", literals=()) -> CallGrammar:
    tools = ToolSet.from_functions([{"name": "Act", "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}])
    return CallGrammar(tools, get_format("json"), conversation=conversation, literals=literals)


# ---- values from the conversation ------------------------------------------------------------

def test_words_capitalised_because_they_open_a_sentence_are_not_names() -> None:
    conversation = ("<user>Can you cancel my appointment with Dr. Kim? The ID is 34567890.</user>\n"
                    "<response>Sure. Please wait, John.</response>\n"
                    "<user> Based on our conversation above, John Smith.</user>")
    spans = value_like_spans(conversation)
    assert spans[:3] == ["John Smith", "John", "34567890"]  # the latest first
    assert "Dr. Kim" in spans
    for opener in ("Based", "Sure", "Please", "Can"):
        assert opener not in spans
    # A name that opens a sentence is still a name when it is capitalised elsewhere too.
    assert "Alice" in value_like_spans("Alice called. I told Alice to wait.")


def test_a_value_introduced_by_the_parameters_words_is_drafted_first() -> None:
    calls = one_tool({"appointment_id": {"type": "string"}, "doctor": {"type": "string"}},
                     "<user>The appointment ID is 34567890. My doctor is Dr. Lee and my "
                     "username is Kim99.</user>")
    drafts = drafts_from(calls, '{"name": "Act", "arguments": {"appointment_id": "')
    assert drafts[0].startswith('34567890", "doctor": "')
    after_id = '{"name": "Act", "arguments": {"appointment_id": "34567890", "doctor": "'
    assert drafts_from(calls, after_id)[0].startswith('Dr. Lee"}}')


# ---- dates and times being typed -------------------------------------------------------------

@pytest.mark.parametrize("typed, expected", [
    ("2023-03-25 12", DateValue(":00:00", True)),
    ("2023-03-25 12:", DateValue("00:00", True)),
    ("2023-03-25 12:0", DateValue("0:00", True)),
    ("2023-03-25 12:00:00", DateValue("", True)),  # the pattern ends: the value closes
    ("2023", DateValue("-", False)),  # the month is not known: the separator only
    ("2023-03-25 1", None),  # inside the hour: no guess
    ("2023-03-25 12:3", None),  # minutes begun with a digit other than zero
    ("2023-0", None),
    ("March", None),  # does not fit the pattern
    ("2023-03-25 12:00:00Z", None),  # runs past the pattern
])
def test_a_value_being_typed_goes_on_as_its_pattern_says(typed, expected) -> None:
    assert complete_in_pattern(typed, DATE_TIME) == expected


def test_patterns_with_fields_of_varying_width_are_not_completed() -> None:
    assert complete_in_pattern("March 3", "%B %d %H:%M") is None
    assert complete_in_pattern("10", "%I:%M %p") is None
    assert complete_in_pattern("10", "%H:%M") == DateValue(":00", True)


def test_the_grammar_closes_a_time_with_zero_minutes_and_seconds() -> None:
    pattern = {"type": "string", "description": f"Format: {DATE_TIME}"}
    calls = one_tool({"start": pattern, "end": pattern}, "<user>Book March 25th.</user>")
    typed = '{"name": "Act", "arguments": {"start": "2023-03-25 12'
    assert drafts_from(calls, typed, PATTERN)[0] == ':00:00", "end": "'
    assert drafts_from(calls, '{"name": "Act", "arguments": {"start": "2023-03-25 1',
                       PATTERN) == []


# ---- objects and arrays the prompt spells out ------------------------------------------------

def test_literals_are_read_from_python_and_json_text() -> None:
    text = ("Parameters: {'token': {'type': 'str', 'description': \"The user's token.\"}}\n"
            'Tools: [{"name": "f", "flags": [true, null]}] and {not a literal}. '
            "It's {'open': 'but never closed'")
    found = nested_literals(text)
    assert found[:2] == [
        NestedLiteral(None, {"token": {"type": "str", "description": "The user's token."}}),
        NestedLiteral("token", {"type": "str", "description": "The user's token."}),
    ]
    assert found[2:] == [NestedLiteral(None, [{"name": "f", "flags": [True, None]}]),
                         NestedLiteral(None, {"name": "f", "flags": [True, None]}),
                         NestedLiteral("flags", [True, None])]
    assert nested_literals("{'a': {1, 2}}") == []  # a set: not something JSON can write


def test_a_parameters_own_schema_is_drafted_once_the_model_begins_writing_it() -> None:
    prompt = ("1. Name: Act\nParameters: {'token': {'type': 'str', 'description': 'The token.'},"
              " 'note': {'type': 'str', 'description': 'A note.'}}")
    calls = one_tool({"token": {"type": "string"}, "note": {"type": "string"}},
                     literals=nested_literals(prompt))
    opened = '{"name": "Act", "arguments": {"token": {"'
    drafts = drafts_from(calls, opened, LITERAL)
    assert drafts[0] == 'type": "str", "description": "The token."}, "note": "'
    assert any(d.startswith('type": "str", "description": "A note."}') for d in drafts)
    # The model's JSON spacing is kept; a nested value that matches no literal gets nothing.
    compact = '{"name":"Act","arguments":{"token":{"type":"str","des'
    assert drafts_from(calls, compact, LITERAL, COMPACT_STYLE)[0].startswith(
        'cription":"The token."},"note":"')
    assert drafts_from(calls, '{"name": "Act", "arguments": {"token": {"kind', LITERAL) == []


def test_an_object_the_prompt_spells_out_is_laid_out_at_its_depth_in_an_indented_call() -> None:
    prompt = "Average John's scores {'math':90, 'science':75} and grades ['A', 'B']."
    calls = one_tool({"gradeDict": {"type": "object"}, "grades": {"type": "array"}},
                     literals=nested_literals(prompt))
    opened = '{\n  "name": "Act",\n  "arguments": {\n    "gradeDict": {'
    drafts = drafts_from(calls, opened, LITERAL, INDENTED_STYLE)
    assert drafts[0].startswith('\n      "math": 90,\n      "science": 75\n    },\n    "grades"')
    listed = opened + '\n      "math": 90,\n      "science": 75\n    },\n    "grades": ['
    assert drafts_from(calls, listed, LITERAL, INDENTED_STYLE)[0].startswith('"A", "B"]\n  }')


def test_the_scanner_knows_where_a_nested_value_began() -> None:
    scanner = get_format("json").scanner()
    scanner.feed('{"name": "Act", "arguments": {"token": ')
    assert scanner.nested_value_start is None
    scanner.feed('{"type": [1, ')
    assert scanner.text[scanner.nested_value_start:] == '{"type": [1, '
    scanner.feed("2]}")
    assert scanner.nested_value_start is None


def test_a_string_for_a_parameter_the_schema_lacks_is_still_drafted() -> None:
    calls = one_tool({"appointment_id": {"type": "string"}},
                     "<user>The appointment ID is 90123456 and the doctor is Dr. Smith.</user>")
    # The model passes a parameter the tool does not have: once it opens a string, the
    # conversation's values are drafted for it all the same.
    typed = '{"name": "Act", "arguments": {"appointment_id": "90123456", "doctor_name": "'
    assert drafts_from(calls, typed)[0] == 'Dr. Smith"}}'


def test_strings_inside_an_array_are_copied_from_the_conversation() -> None:
    calls = one_tool({"attendees": {"type": "array", "items": {"type": "string"}}},
                     "<user>Invite John Smith and Jane Doe.</user>")
    in_array = '{"name": "Act", "arguments": {"attendees": ["John Smith", "Ja'
    assert drafts_from(calls, in_array)[0] == 'ne Doe"]}}'
    # A key inside a nested object is not a value: no conversation span is offered for it.
    assert drafts_from(calls, '{"name": "Act", "arguments": {"attendees": [{"Ja') == []


def test_numbers_follow_the_parameters_words_and_the_digits_typed() -> None:
    calls = one_tool({"height": {"type": "integer"}, "base": {"type": "integer"}},
                     "Find the area of a triangle with a base of 10 and a height of 5. "
                     "Also 123456.")
    # ``height`` comes first in the schema; the number the query gives it is 5, not the first.
    assert drafts_from(calls, '{"name": "Act", "arguments": {"height": ')[0] \
        .startswith('5, "base": ')
    # A number being typed is one of the conversation's that starts with its digits.
    typed = '{"name": "Act", "arguments": {"height": 5, "base": 12'
    assert '3456}}' in drafts_from(calls, typed)


def test_a_snake_case_value_goes_on_with_the_conversations_words() -> None:
    calls = one_tool({"fields": {"type": "array", "items": {"type": "string"}}},
                     "Get his points per game, assists, and minutes per game.")
    assert drafts_from(calls, '{"name": "Act", "arguments": {"fields": ["points_p')[0] \
        .startswith('er_game"')
    assert drafts_from(calls, '{"name": "Act", "arguments": {"fields": ["assists", "min'
                       )[0].startswith('utes per game"')  # no underscore typed: as written


def test_the_search_for_literals_is_bounded(monkeypatch) -> None:
    # Every unclosed bracket is followed to the text's end; the search stops once its budget
    # of characters is spent, so a prompt full of them costs no more than a fixed amount.
    text = "[" * 100 + " {'a': 1}"
    assert nested_literals(text) == [NestedLiteral(None, {"a": 1})]
    monkeypatch.setattr(prompt_literals, "_MAX_SCANNED", 1_000)
    assert nested_literals(text) == []
