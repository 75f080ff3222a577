"""Object and array arguments drafted from the schema inside them (pure text, toy schemas)."""

from test_value_candidates import drafts_from

from toolspec.calls.formats import DEFAULT_STYLE, INDENTED_STYLE, NestedAnchor, get_format
from toolspec.calls.tools import ToolSet
from toolspec.drafting.call_grammar import CallGrammar
from toolspec.drafting.nested_values import NestedValueGrammar, Typing
from toolspec.drafting.text_drafts import ELEMENT

PROPERTIES = {
    "point": {"type": "array", "items": {"type": "integer"}},
    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "budget": {"type": "object", "required": ["min", "max"],
               "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}},
    "grades": {"type": "object"},
    "units": {"type": "array", "items": {"type": "string", "enum": ["metric", "imperial"]}},
    "people": {"type": "array", "items": {"type": "string"}},
}
CONVERSATION = ("Go from (3, 4) with a budget from 300 to 400; math 90, science 75. "
                "Invite them: Robert Lee and Anna Zhang.")


def grammar() -> CallGrammar:
    tools = ToolSet.from_functions([{"name": "Act", "parameters": {
        "type": "object", "properties": PROPERTIES}}])
    return CallGrammar(tools, get_format("json"), conversation=CONVERSATION)


CALL = '{"name": "Act", "arguments": {'
INDENTED_CALL = '{\n  "name": "Act",\n  "arguments": {\n    '


# ---- where the scanner says a nested value stands ---------------------------------------------

def test_the_scanner_reports_each_open_container_and_its_anchor() -> None:
    def containers(text: str):
        scanner = get_format("json").scanner()
        scanner.feed(CALL + text)
        return [(c.is_object, c.key, c.keys, c.scalars, c.anchor)
                for c in scanner.nested_containers]

    assert containers('"a": 1') == []
    assert containers('"a": [') == [(False, None, (), (), NestedAnchor.OPENED)]
    assert containers('"a": [3') == [(False, None, (), (), NestedAnchor.OPENED)]
    assert containers('"a": [3, "x"') == [(False, None, (), ("3", '"x"'),
                                           NestedAnchor.AFTER_ELEMENT)]
    assert containers('"a": [3, 4, ') == [(False, None, (), ("3", "4"),
                                           NestedAnchor.AFTER_ELEMENT)]
    assert containers('"a": {"m') == [(True, None, (), (), NestedAnchor.OPENED)]
    assert containers('"a": {"m": 3') == [(True, "m", ("m",), (), NestedAnchor.AFTER_KEY)]
    assert containers('"a": {"m": 3, "n') == [(True, "m", ("m",), ("3",),
                                               NestedAnchor.AFTER_ELEMENT)]
    # An outer container's anchor is where its open element leaves it.
    assert [c[4] for c in containers('"a": [{"m": [1')] == [
        NestedAnchor.AFTER_ELEMENT, NestedAnchor.AFTER_KEY, NestedAnchor.OPENED]


# ---- arrays -------------------------------------------------------------------------------------

def test_an_array_of_numbers_is_drafted_element_by_element_from_the_conversation() -> None:
    calls = grammar()
    # At the colon: the bracket and the conversation's first number.
    assert drafts_from(calls, CALL + '"point": ')[0].startswith("[3")
    # After an element: the next unused number, then the rest of the call once it closes.
    assert drafts_from(calls, CALL + '"point": [3, ')[0] == '4]}}'
    assert '4], "grid": ' in drafts_from(calls, CALL + '"point": [3, ')
    # A number being typed continues as one of the conversation's.
    assert drafts_from(calls, CALL + '"point": [3, 40')[0] == '0]}}'


def test_strings_in_an_array_are_copied_and_the_list_goes_on() -> None:
    calls = grammar()
    drafts = drafts_from(calls, CALL + '"people": ["Robert Lee", "An')
    assert drafts[0] == 'na Zhang"]}}'
    # Each element is a choice, and so is "another one or the end": after the first name the
    # second one is offered too.
    assert ', "Anna Zhang"]}}' in drafts_from(calls, CALL + '"people": ["Robert Lee"')


def test_enum_members_fill_an_array_without_repeating() -> None:
    calls = grammar()
    assert drafts_from(calls, CALL + '"units": [')[:2] == ['"metric"]}}', '"imperial"]}}']
    after_metric = drafts_from(calls, CALL + '"units": ["metric"')
    assert ', "imperial"]}}' in after_metric
    assert ', "metric"]}}' not in after_metric


def test_arrays_nest() -> None:
    calls = grammar()
    assert drafts_from(calls, CALL + '"grid": [[3, 4]')[0] == ']}}'
    assert any(d.startswith("[3") for d in drafts_from(calls, CALL + '"grid": [[1, 2], '))


# ---- objects ------------------------------------------------------------------------------------

def test_an_objects_properties_are_drafted_in_schema_order_in_the_models_layout() -> None:
    calls = grammar()
    assert drafts_from(calls, CALL + '"budget": {')[0].startswith('"min": 3')
    indented = drafts_from(calls, INDENTED_CALL + '"budget": {', style=INDENTED_STYLE)
    assert indented[0].startswith('\n      "min": ')
    # Once every required key has its value, the object closes one level out.
    typed = INDENTED_CALL + '"budget": {\n      "min": 300,\n      "max": 400'
    assert drafts_from(calls, typed, style=INDENTED_STYLE)[0] == "\n    }\n  }\n}"


def test_a_free_form_object_gets_its_layout_but_no_invented_keys() -> None:
    calls = grammar()
    typed = INDENTED_CALL + '"grades": {\n      "math": 90'
    drafts = drafts_from(calls, typed, style=INDENTED_STYLE)
    assert ',\n      "' in drafts  # the next key's indentation and quote
    assert any(d.startswith("\n    }\n") for d in drafts)
    assert not any(d.startswith(',\n      "') and len(d) > len(',\n      "') for d in drafts)


# ---- the grammar on its own ---------------------------------------------------------------------

class ToyValues:
    """Two numbers, and nothing typed-specific: enough to see the branching."""

    def scalar_values(self, schema, name, taken):
        return [(text, prior) for text, prior in (("1", 0.5), ("2", 0.25)) if text not in taken]

    def typed_scalar_values(self, schema, partial, in_string):
        return [("12", 0.3)] if "12".startswith(partial) and not in_string else []


def test_each_branch_passes_at_most_depth_choices_and_says_when_it_closes() -> None:
    nested = NestedValueGrammar(ToyValues(), DEFAULT_STYLE, base_level=2)
    schema = {"type": "array", "items": {"type": "integer"}}
    branches = nested.from_value_start(schema, "xs", depth=2)
    texts = {"".join(s.text for s in segments): closes for segments, closes in branches}
    # Each element is a choice: two of them, then the list is drafted to close.
    assert texts == {"[1]": True, "[1, 2]": True, "[2]": True, "[2, 1]": True}
    element = next(s for segments, _ in branches for s in segments if s.text == "1")
    assert element.source == ELEMENT and element.prior == 0.5
    # A value already chosen earlier in the same branch is not offered again, and a branch
    # out of choices stops inside the value.
    deeper = nested.from_value_start({"type": "array", "items": {"type": "array"}}, "xs", 2)
    assert {"".join(s.text for s in segments) for segments, _ in deeper} == {
        "[[1]]", "[[1, 2]]", "[[1], [1]]", "[[1], [2]]",
        "[[2]]", "[[2, 1]]", "[[2], [1]]", "[[2], [2]]"}


def test_what_is_typed_narrows_the_element_choices() -> None:
    nested = NestedValueGrammar(ToyValues(), DEFAULT_STYLE, base_level=2)
    scanner = get_format("json").scanner()
    scanner.feed(CALL + '"xs": [1')
    branches = nested.from_anchor({"type": "array", "items": {"type": "integer"}}, "xs",
                                  scanner.nested_containers, Typing("1", False), depth=2)
    texts = {"".join(s.text for s in segments) for segments, _ in branches}
    assert texts == {"1]", "1, 2]", "12]", "12, 1]", "12, 2]"}
    # "1" ends here with the prior of what follows it (a segment typed in full no longer
    # counts); "12" goes on with its own.
    ends_here = next(segments for segments, _ in branches
                     if [s.text for s in segments[:2]] == ["1", "]"])
    assert ends_here[0].prior == 1.0 and ends_here[1].prior < 1.0
