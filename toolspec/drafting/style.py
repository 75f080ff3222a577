"""What the model has been seen to write around its calls, remembered across requests.

Its JSON spacing (``{"a": 1}`` vs ``{"a":1}``), the text before its first call and the text after
its last one, and the years of the dates it writes (the best guess for a date said without
one). Drafts follow these habits instead of the format's textbook rendering.
"""

from __future__ import annotations

import re
from collections import Counter

from toolspec.calls.formats import (
    COMPACT_STYLE,
    DEFAULT_STYLE,
    INDENTED_STYLE,
    CallFormat,
    CallScanner,
    JsonStyle,
)
from toolspec.drafting.date_values import date_values

_COLON = re.compile(r'"name"(\s*):(\s*)"')
_INDENT = re.compile(r'\{\n([ \t]+)"name"')
_COMMA = re.compile(r'"(\s*),(\s*)"')
_MAX_WRAPPER = 40


class StyleMemory:
    """What the model has been seen to write, across requests. Mutates: its counters."""

    def __init__(self) -> None:
        self.styles: Counter[JsonStyle] = Counter()
        self.openings: dict[str, Counter[str]] = {}
        # Per format and opening: what followed the last call. A model that opened with the
        # block's fence closes it; one that started with a bare object does not.
        self.closings: dict[tuple[str, str], Counter[str]] = {}
        self.years: Counter[int] = Counter()  # years of the date values the model wrote

    def style_of(self, text: str) -> JsonStyle | None:
        colon, comma = _COLON.search(text), _COMMA.search(text)
        if colon is None:
            return None
        indent = _INDENT.search(text)
        if indent is not None:
            return JsonStyle(colon.group(1) + ":" + colon.group(2), ",", indent.group(1))
        colon_text = colon.group(1) + ":" + colon.group(2)
        comma_text = (comma.group(1) + "," + comma.group(2)) if comma else (
            DEFAULT_STYLE.comma if colon_text == DEFAULT_STYLE.colon else COMPACT_STYLE.comma)
        return JsonStyle(colon_text, comma_text)

    def style_options(self, current_text: str) -> list[tuple[JsonStyle, float]]:
        """The style seen in this output, else the styles seen before, else both common ones."""
        seen = self.style_of(current_text)
        if seen is not None:
            return [(seen, 1.0)]
        if self.styles:
            total = sum(self.styles.values())
            return [(style, count / total) for style, count in self.styles.most_common(2)]
        return [(DEFAULT_STYLE, 0.6), (INDENTED_STYLE, 0.25), (COMPACT_STYLE, 0.15)]

    @staticmethod
    def _options(counter: Counter[str] | None, default: str) -> list[tuple[str, float]]:
        if not counter:
            return [(default, 1.0)]
        total = sum(counter.values())
        return [(text, count / total) for text, count in counter.most_common(3)]

    def opening_options(self, call_format: CallFormat) -> list[tuple[str, float]]:
        return self._options(self.openings.get(call_format.name),
                             call_format.block_open + call_format.call_open)

    def closing_options(self, call_format: CallFormat, opening: str) -> list[tuple[str, float]]:
        """What follows the last call of an output that began with ``opening``: what followed
        it before, else the format's closing text — the block's end only if the output opened
        the block, and a closing fence if it opened a Markdown fence instead."""
        block = call_format.block_open.strip()
        if block and block in opening:
            default = call_format.call_close + call_format.block_close
        elif opening.lstrip().startswith("```"):
            default = "\n```"
        else:
            default = call_format.call_close + ("" if block else call_format.block_close)
        return self._options(self.closings.get((call_format.name, opening)), default)

    def year_options(self) -> tuple[int, ...]:
        """The years the model has written date values in, the most used first."""
        return tuple(year for year, _ in self.years.most_common(2))

    def learn(self, call_format: CallFormat, scanner: CallScanner, end: str = "") -> None:
        """Record the spacing, opening, closing and date years of a finished output that held
        calls; ``end``: the text of the special token that ended it (part of the closing: a
        drafted closing then ends the output with the token this model ends it with)."""
        if not scanner.calls:
            return
        self.years.update(date.year for date in date_values(scanner.text) if date.year)
        style = self.style_of(scanner.text)
        if style is not None:
            self.styles[style] += 1
        first, last = scanner.calls[0], scanner.calls[-1]
        # Short wrappers only: a long preamble is prose, not a habit worth drafting.
        opening = scanner.text[: first.start]
        if len(opening) <= _MAX_WRAPPER:
            self.openings.setdefault(call_format.name, Counter())[opening] += 1
        closing = scanner.text[last.end:] + end
        if len(opening) <= _MAX_WRAPPER and len(closing) <= _MAX_WRAPPER:
            self.closings.setdefault((call_format.name, opening), Counter())[closing] += 1
