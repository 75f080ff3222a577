"""Candidate continuations as text: segments that carry where they came from and how likely
they are, before any tokenizer sees them. Shared by every candidate source (the schema
grammar, its nested-value part, the call library) and by the drafter that tokenizes them.

Pure data; no tokenizer, no model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

# Sources, as the draft budget calibrates them (acceptance is learned per source).
FIXED = "schema/fixed"
OPEN = "schema/open"
NAME = "schema/name"
PARAM = "schema/param"
VALUE = "schema/value"
DATE = "schema/date"  # a date or time of the conversation, spelled as the schema asks
PATTERN = "schema/pattern"  # the rest of a date or time being typed, as its pattern goes on
LITERAL = "schema/literal"  # an object or array value the prompt spells out (its own schema)
ELEMENT = "schema/element"  # an element of an object or array value, from the schema inside it
CLOSE = "schema/close"


@dataclass(frozen=True)
class Segment:
    """A piece of a candidate; ``prior`` is its chance given the segments before it."""

    text: str
    source: str
    prior: float = 1.0


@dataclass(frozen=True)
class TextDraft:
    """One candidate continuation; ``ends_output`` means the end-of-sequence token follows it."""

    segments: tuple[Segment, ...]
    ends_output: bool = False

    @cached_property
    def text(self) -> str:
        return "".join(segment.text for segment in self.segments)

    @cached_property
    def probability(self) -> float:
        product = 1.0
        for segment in self.segments:
            product *= segment.prior
        return product

    def after(self, typed: str) -> TextDraft | None:
        """This draft with ``typed`` (a prefix of its text) removed; None if it disagrees."""
        if not self.text.startswith(typed):
            return None
        remaining, kept = len(typed), []
        for segment in self.segments:
            if remaining == 0:
                kept.append(segment)
            elif remaining >= len(segment.text):
                remaining -= len(segment.text)  # typed in full: the model already chose it
            else:
                kept.append(Segment(segment.text[remaining:], segment.source, segment.prior))
                remaining = 0
        return TextDraft(tuple(kept), self.ends_output)


Branch = tuple[tuple[Segment, ...], bool]  # segments, ends_output


def scaled(segments: tuple[Segment, ...], factor: float) -> tuple[Segment, ...]:
    """``segments`` with the first one's prior multiplied by ``factor``."""
    if not segments or factor == 1.0:
        return tuple(segments)
    first = segments[0]
    return (Segment(first.text, first.source, first.prior * factor), *segments[1:])


def quoted_inner(text: str) -> str:
    """``text`` as it appears between JSON quotes (escaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]
