"""The values a conversation offers a call's arguments, ranked for each parameter.

Argument values are mostly copied: a number the user stated, a name, an id, a quoted phrase, a
date. ``ConversationValues`` reads them out of the conversation once per request (numbers as
JSON writes them, value-like spans, date mentions) and answers, for a parameter, which of them
are likely: those the conversation introduces with the parameter's words first ("the
appointment ID is 34567890" for ``appointment_id``), then the most recent; and, for a value
being typed, which of them go on from what is typed. Values the call being written already
holds are not offered again (``note_written``).

Pure text; no tokenizer, no model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from toolspec.drafting.date_values import (
    DateMention,
    DateValue,
    find_date_mentions,
    mentions_written,
    render,
)
from toolspec.drafting.number_values import stated_numbers
from toolspec.drafting.text_drafts import quoted_inner

_MAX_NUMBERS = 4
_MAX_STRINGS = 4
_MAX_DATES = 4
_MAX_SPANS = 3


class ConversationValues:
    """One request's conversation, read for argument values.

    Mutates (``note_written``): which values and dates count as used by the output so far;
    per-parameter rankings are cached for the request.
    """

    def __init__(self, conversation: str) -> None:
        self.conversation = conversation
        stated = stated_numbers(conversation)
        self._numbers = [number.value for number in stated]
        self._number_spellings = {number.value: number.spelled for number in stated}
        self._strings = value_like_spans(conversation)
        self._strings_ranked: dict[str, list[str]] = {}
        self._numbers_ranked: dict[str, list[str]] = {}
        self.dates = latest_message_first(find_date_mentions(conversation), conversation)
        self.years = list(dict.fromkeys(m.year for m in self.dates if m.year))  # latest first
        self.used: frozenset[str] = frozenset()  # numbers and strings the output holds
        self.used_dates: frozenset[int] = frozenset()  # indexes into ``dates``

    def note_written(self, output: str) -> None:
        """Count the numbers, strings and dates ``output`` (the text so far) holds as used."""
        numbers_written = set(_NUMBER.findall(output))
        self.used = frozenset(
            [n for n in self._numbers if n in numbers_written]
            + [s for s in self._strings if f'"{quoted_inner(s)}"' in output])
        self.used_dates = mentions_written(self.dates, output) if self.dates else frozenset()

    def dates_written(self, patterns: Sequence[str], year: int | None) -> list[DateValue]:
        """The date mentions the output does not hold yet, written in each of ``patterns``
        (``year`` for a year a mention leaves out), the latest message's first; each with
        whether it is whole (a date without a time stops before the time fields)."""
        written = (render(mention, pattern, year)
                   for index, mention in enumerate(self.dates) if index not in self.used_dates
                   for pattern in patterns)
        return list(dict.fromkeys(value for value in written if value is not None))[:_MAX_DATES]

    def strings_for(self, parameter: str, share: float) -> list[tuple[str, float]]:
        """Unused string values (quoted text, names, ids, dates as written) for
        ``parameter``, likeliest first, with priors ``share``, half of it, a quarter, ..."""
        ranked = self._ranked_for(parameter, self._strings, self._strings_ranked, {})
        return _halving([span for span in ranked if span not in self.used][:_MAX_STRINGS], share)

    def numbers_for(self, parameter: str, integers_only: bool,
                    share: float) -> list[tuple[str, float]]:
        """Unused numbers (as JSON writes them) for ``parameter``, likeliest first: those the
        conversation introduces with its words ("a height of 5" for ``height``), then in
        order of appearance; priors as ``strings_for``'s."""
        ranked = self._ranked_for(parameter, self._numbers, self._numbers_ranked,
                                  self._number_spellings)
        return _halving([n for n in ranked if n not in self.used
                         and not (integers_only and "." in n)][:_MAX_NUMBERS], share)

    def numbers_going_on(self, partial: str, share: float) -> list[tuple[str, float]]:
        """The conversation's numbers that go on from the digits typed, sharing ``share``."""
        return _shared([n for n in self._numbers
                        if len(n) > len(partial) and n.startswith(partial)][:_MAX_NUMBERS], share)

    def spans_going_on(self, partial: str, share: float) -> list[tuple[str, float]]:
        """The conversation's spans that go on from the string typed, sharing ``share``; for a
        snake_case string the conversation does not hold, its words as the conversation goes
        on from them, joined by underscores ("social security numbers" for ``social_se``)."""
        spans = spans_starting_with(self.conversation, partial) if partial else []
        if not spans and "_" in partial.strip("_"):
            spans = [span.replace(" ", "_") for span in
                     spans_starting_with(self.conversation, partial.replace("_", " "))]
        return _shared(spans, share)

    def _ranked_for(self, parameter: str, values: list[str], cache: dict[str, list[str]],
                    spellings: Mapping[str, str]) -> list[str]:
        """``values`` in ``anchored_first`` order for ``parameter``. Mutates: ``cache``."""
        ranked = cache.get(parameter)
        if ranked is None:
            ranked = cache[parameter] = anchored_first(values, self.conversation, parameter,
                                                       spellings)
        return ranked


def _halving(values: Sequence[str], share: float) -> list[tuple[str, float]]:
    """Ranked ``values`` with geometrically decreasing priors, from ``share``."""
    return [(value, share * 0.5 ** rank) for rank, value in enumerate(values)]


def _shared(values: Sequence[str], share: float) -> list[tuple[str, float]]:
    """``values`` splitting ``share`` evenly."""
    return [(value, share / len(values)) for value in values]


def is_written_number(text: str) -> bool:
    """Whether ``text`` is a whole number as a call writes one (``-12``, ``3.5``)."""
    return _NUMBER.fullmatch(text) is not None


# A number as the call so far writes it (the conversation's are read by ``stated_numbers``).
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")
_SENTENCE_ENDS = ".!?\n>:"
_WORD = re.compile(r"[a-z0-9]+")
_ANCHOR_WINDOW = 48  # characters before a span in which a parameter's words introduce it
_SENTENCE_BREAK = re.compile(r"[.!?](?:\s|$)|\n")
# Spans that tend to be argument values: quoted text, capitalised names, tokens with digits
# (ids, dates, times, emails).
_VALUE_LIKE = re.compile(
    r"\"([^\"\n]{1,60})\"|'([^'\n]{2,60})'"
    r"|(?P<name>(?:(?:Dr|Mr|Mrs|Ms|Prof)\.\s?)?[A-Z][\w'&-]*(?:\s+[A-Z][\w'&-]*)*)"
    r"|([\w.@:/+-]*\d[\w.@:/+-]*)"
)
_SPAN_STOPS = '"\n,;:!?()[]{}<>'


def latest_message_first(mentions: Sequence[DateMention], text: str) -> list[DateMention]:
    """``mentions`` of later lines (messages) first; within a line in order of appearance (the
    order in which "from 2pm to 4pm" fills a start and an end)."""
    return sorted(mentions, key=lambda m: (-text.count("\n", 0, m.position), m.position))


def value_like_spans(conversation: str) -> list[str]:
    """Distinct value-like spans, the most recently mentioned first. A lone capitalised word
    that opens a sentence ("Sure", "Based", "Please") is capitalised for the sentence's sake,
    not as a name, unless it is also capitalised inside a sentence somewhere."""
    spans: dict[str, int] = {}
    sentence_openers: set[str] = set()
    inside_sentence: set[str] = set()
    for match in _VALUE_LIKE.finditer(conversation):
        span = next(group for group in match.groups() if group is not None).strip().rstrip(".")
        if len(span) < 2:
            continue
        if match.group("name") is not None and " " not in span:
            opens = _opens_sentence(conversation, match.start())
            (sentence_openers if opens else inside_sentence).add(span)
        spans[span] = match.start()
    dropped = sentence_openers - inside_sentence
    return sorted((s for s in spans if s not in dropped), key=lambda span: -spans[span])


def anchored_first(spans: Sequence[str], conversation: str, parameter: str,
                   spellings: Mapping[str, str]) -> list[str]:
    """``spans`` (most recent first) reordered so that those preceded, in their sentence, by
    more of ``parameter``'s words come first; the order is kept among equals. A span is looked
    for as ``spellings`` spells it, if there."""
    words = _words_of(parameter)
    if not words:
        return list(spans)
    lowered = conversation.lower()

    def anchoring(span: str) -> int:
        span = spellings.get(span, span)
        best, at = 0, conversation.find(span)
        while at >= 0:
            window = lowered[max(0, at - _ANCHOR_WINDOW): at]
            window = _SENTENCE_BREAK.split(window)[-1]  # the span's own sentence
            best = max(best, len(words & set(_WORD.findall(window))))
            at = conversation.find(span, at + 1)
        return best

    return sorted(spans, key=lambda span: -anchoring(span))


def _words_of(identifier: str) -> set[str]:
    """The lowercase words of a parameter name: ``appointment_id`` and ``appointmentId`` both
    give {"appointment", "id"}."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", identifier)
    return {word for word in _WORD.findall(spaced.lower()) if len(word) >= 2}


def _opens_sentence(text: str, at: int) -> bool:
    """Whether ``text[at:]`` starts a sentence: nothing but spaces and markup (``**``, a
    ``<user>`` tag, a quote) between it and the text's start or a sentence's end."""
    before = text[max(0, at - 64): at].rstrip(" \t*\"'")  # a bounded look back
    return not before or before[-1] in _SENTENCE_ENDS


def spans_starting_with(conversation: str, partial: str, longest: int = 80) -> list[str]:
    """Distinct spans of ``conversation`` that start with ``partial`` and run to a delimiter
    (or to the end of the word), most recent first."""
    spans: list[str] = []
    at = conversation.rfind(partial)
    while at >= 0 and len(spans) < _MAX_SPANS:
        tail = conversation[at: at + longest]
        stop = next((i for i, c in enumerate(tail) if i >= len(partial) and c in _SPAN_STOPS),
                    len(tail))
        phrase = tail[:stop].rstrip(" .")
        word_end = next((i for i, c in enumerate(phrase) if i >= len(partial) and c == " "),
                        len(phrase))
        for span in (phrase, phrase[:word_end]):
            if len(span) > len(partial) and span not in spans:
                spans.append(span)
        at = conversation.rfind(partial, 0, at)
    return spans[:_MAX_SPANS]
