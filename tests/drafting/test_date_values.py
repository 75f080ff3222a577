"""Dates and times from the conversation, spelled as a parameter's schema asks (pure text)."""

import pytest

from toolspec.calls.formats import DEFAULT_STYLE, get_format
from toolspec.calls.tools import ToolSet
from toolspec.drafting.call_grammar import CallGrammar
from toolspec.drafting.date_values import (
    DateMention,
    DateValue,
    find_date_mentions,
    mentions_written,
    render,
    value_patterns,
)
from toolspec.drafting.style import StyleMemory
from toolspec.drafting.text_drafts import DATE

DATE_TIME = "%Y-%m-%d %H:%M:%S"


def fields(mention: DateMention) -> tuple:
    return (mention.year, mention.month, mention.day, mention.hour, mention.minute)


@pytest.mark.parametrize("text, expected", [
    ("a meeting on March 20th from 2pm to 4pm in Room A",
     [(None, 3, 20, 14, 0), (None, 3, 20, 16, 0)]),
    ("my alarm for March 20th, 2023 at 6:30AM?", [(2023, 3, 20, 6, 30)]),
    ("on the 21th of September at 3 pm.", [(None, 9, 21, 15, 0)]),
    ("the time is 2023-08-06 09:00:00 and", [(2023, 8, 6, 9, 0)]),
    ("Sept. 3 at noon", [(None, 9, 3, 12, 0)]),
    ("on Feb 30 at 5pm", [(None, None, None, 17, 0)]),  # no such day: the time alone
    ("On May 20th, 2023. Later, at 10:15.",
     [(2023, 5, 20, None, None), (None, None, None, 10, 15)]),
    ("I may 5 times ask", [(None, 5, 5, None, None)]),  # a word that spells a month counts
    ("no dates here, only 42 and 13:99", []),
])
def test_mentions_pair_dates_with_the_times_of_their_sentence(text, expected) -> None:
    assert [fields(m) for m in find_date_mentions(text)] == expected


@pytest.mark.parametrize("schema, patterns", [
    ({"description": "The time. Format: %Y-%m-%d %H:%M:%S"}, [DATE_TIME]),
    ({"description": "The new date. Format: %Y-%m-%d."}, ["%Y-%m-%d"]),
    ({"description": "Date in YYYY-MM-DD format", "format": "date"}, ["%Y-%m-%d"]),
    ({"description": "When, as YYYY-MM-DD HH:MM"}, ["%Y-%m-%d %H:%M"]),
    ({"format": "date-time"}, ["%Y-%m-%dT%H:%M:%S"]),
    ({"description": "Start at HH:MM"}, ["%H:%M"]),
    ({"description": "A city name"}, []),
])
def test_value_patterns_come_from_the_description_or_the_format(schema, patterns) -> None:
    assert value_patterns(schema) == patterns


def test_render_writes_what_the_mention_knows() -> None:
    full = DateMention(None, 3, 20, 14, 0, 0)
    assert render(full, DATE_TIME, 2023) == DateValue("2023-03-20 14:00:00", True)
    assert render(full, "%H:%M", None) == DateValue("14:00", True)
    date_only = DateMention(2022, 5, 6)
    # The conversation gives no time: the draft stops where the time would begin.
    assert render(date_only, DATE_TIME, None) == DateValue("2022-05-06 ", False)
    assert render(date_only, "%Y-%m-%d", None) == DateValue("2022-05-06", True)
    assert render(full, DATE_TIME, None) is None  # no year known
    assert render(DateMention(hour=9), DATE_TIME, 2023) is None  # no date
    assert render(DateMention(2023, 1, 2), "%H:%M", None) is None  # no time


def test_only_dates_that_open_a_value_are_written() -> None:
    said = find_date_mentions("from March 20th at 2pm to March 20th at 4pm")
    in_free_text = '{"content": "Call at March 20th at 2pm", "start": "'
    assert mentions_written(said, in_free_text) == frozenset()
    assert mentions_written(said, in_free_text + '2023-03-20 14:00:00", "end": "') == {0}


def grammar(conversation: str, description: str = f"Format: {DATE_TIME}") -> CallGrammar:
    tools = ToolSet.from_functions([{"name": "Book", "parameters": {"type": "object",
        "properties": {"start": {"type": "string", "description": description},
                       "end": {"type": "string", "description": description}},
        "required": ["start", "end"]}}])
    return CallGrammar(tools, get_format("json"), conversation=conversation)


def value_texts(calls: CallGrammar, output: str, years: tuple[int, ...] = ()) -> list[str]:
    scanner = calls.format.scanner()
    scanner.feed(output)
    typed = scanner.text[scanner.anchor:]
    texts = []
    for draft in calls.continuations(scanner, [(DEFAULT_STYLE, 1.0)], years=years):
        rest = draft.after(typed)
        if rest is not None and any(s.source == DATE for s in rest.segments):
            texts.append(rest.text)
    return texts


def test_a_date_parameter_is_drafted_from_the_conversation() -> None:
    calls = grammar("<user>Book the room on March 20th, 2023 from 2pm to 4pm.</user>")
    start = '{"name": "Book", "arguments": {"start": "'
    drafts = value_texts(calls, start)
    assert drafts[0] == '2023-03-20 14:00:00", "end": "'
    # Once the start is written, the end is the first unused mention.
    assert value_texts(calls, start + '2023-03-20 14:00:00", "end": "')[0] \
        == '2023-03-20 16:00:00"}}'
    assert value_texts(calls, start + '2023-03-20 14:00:00", "end": "2023-03-2')[0] \
        == '0 16:00:00"}}'


def test_a_missing_year_comes_from_what_the_model_writes() -> None:
    calls = grammar("<user>Book it for September 3rd at 9am.</user>")
    start = '{"name": "Book", "arguments": {"start": "'
    assert value_texts(calls, start) == []  # no year anywhere yet
    assert value_texts(calls, start + "2024-")[0].startswith('09-03 09:00:00"')
    assert value_texts(calls, start, years=(2023,))[0].startswith('2023-09-03 09:00:00"')


def test_parameters_without_a_pattern_get_no_dates() -> None:
    calls = grammar("<user>March 20th, 2023 at 2pm</user>", description="Anything")
    assert value_texts(calls, '{"name": "Book", "arguments": {"start": "') == []


def test_style_memory_learns_the_year_of_written_dates() -> None:
    memory = StyleMemory()
    fmt = get_format("json")
    scanner = fmt.scanner()
    scanner.feed('{"name": "Book", "arguments": {"start": "2023-03-20 14:00:00", '
                 '"note": "not 1999-01-01"}}')
    memory.learn(fmt, scanner)
    assert memory.year_options() == (2023,)
