"""Dates and times the conversation mentions, written the way a parameter asks for them.

Users say "March 20th, 2023 at 2pm"; tools want ``2023-03-20 14:00:00``. The conversation holds
the value, the schema holds its spelling (a ``strftime`` pattern or ``YYYY-MM-DD`` in the
description, or a JSON-schema ``format``), and the model writes one digit per token, so a date
the drafter cannot spell costs about one verification step per character.

``DateMention`` is what a span of text says (any field may be missing); ``find_date_mentions``
reads them from the conversation, each date joined with the times said after it in the same
sentence; ``value_patterns`` finds the spelling a parameter asks for; ``render`` writes a mention
in a pattern (a mention without a time yields the date part only: the draft stops where the
conversation stops knowing); ``complete_in_pattern`` continues a value the model is typing
through the pattern's separators and the fields a time nearly always leaves at zero (minutes,
seconds). Pure text, no state.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple

_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"

_DATE_FORMS = (
    re.compile(r"\b(?P<year>\d{4})[-/.](?P<month>[01]?\d)[-/.](?P<day>[0-3]?\d)\b"),
    re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?:,?\s+{_YEAR}\b)?", re.IGNORECASE),
    re.compile(rf"\b(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}\b(?:,?\s+{_YEAR}\b)?", re.IGNORECASE),
)
_TIME_FORMS = (
    re.compile(r"\b(?P<hour>[01]?\d)(?::(?P<minute>[0-5]\d))?(?::(?P<second>[0-5]\d))?\s*"
               r"(?P<half>[ap])\.?m\b\.?", re.IGNORECASE),
    re.compile(r"(?<![\d:])(?P<hour>[0-2]?\d):(?P<minute>[0-5]\d)(?::(?P<second>[0-5]\d))?"
               r"(?![\d:])"),
    re.compile(r"\b(?P<word>noon|midnight)\b", re.IGNORECASE),
)
# Where a sentence ends: times after it belong to another statement.
_SENTENCE_END = re.compile(r"[.!?]\s|\n")


@dataclass(frozen=True)
class DateMention:
    """What one stretch of text says about a date and time; unsaid fields are None."""

    year: int | None = None
    month: int | None = None
    day: int | None = None
    hour: int | None = None
    minute: int | None = None
    second: int | None = None
    position: int = 0  # where the mention starts in the text

    @property
    def has_date(self) -> bool:
        return self.month is not None and self.day is not None

    @property
    def has_time(self) -> bool:
        return self.hour is not None


def find_date_mentions(text: str) -> list[DateMention]:
    """Every date the text mentions, once with each time said after it in the same sentence
    (and once bare when it has no time), then every time said with no date before it; in order
    of position, without repeats."""
    dates = _spans(text, _DATE_FORMS, _date_fields)
    times = _spans(text, _TIME_FORMS, _time_fields)
    mentions: list[DateMention] = []
    paired: set[int] = set()
    for index, (start, end, date) in enumerate(dates):
        next_date = dates[index + 1][0] if index + 1 < len(dates) else len(text)
        sentence = _SENTENCE_END.search(text, end)
        limit = min(next_date, sentence.start() if sentence else len(text))
        own = [(t_start, time) for t_start, t_end, time in times if end <= t_start < limit]
        for t_start, time in own:
            paired.add(t_start)
            mentions.append(replace(date, hour=time.hour, minute=time.minute, second=time.second))
        if not own:
            mentions.append(date)
    mentions += [time for t_start, _, time in times if t_start not in paired]
    unique = {replace(m, position=0): m for m in sorted(mentions, key=lambda m: m.position)}
    return sorted(unique.values(), key=lambda m: m.position)


def _spans(text: str, forms: Sequence[re.Pattern[str]],
           fields: Callable[[re.Match[str]], DateMention | None]
           ) -> list[tuple[int, int, DateMention]]:
    """Non-overlapping matches of ``forms`` (earlier forms win), as mentions, in text order."""
    found: list[tuple[int, int, DateMention]] = []
    for form in forms:
        for match in form.finditer(text):
            if any(s < match.end() and match.start() < e for s, e, _ in found):
                continue
            mention = fields(match)
            if mention is not None:
                found.append((match.start(), match.end(), mention))
    return sorted(found, key=lambda item: item[0])


def _date_fields(match: re.Match[str]) -> DateMention | None:
    month_text, day = match.group("month"), int(match.group("day"))
    month = int(month_text) if month_text.isdigit() else _MONTHS[month_text.lower().rstrip(".")]
    year = int(match.group("year")) if match.group("year") else None
    try:
        datetime(year or 2000, month, day)  # 2000: a leap year, so 29 February stays valid
    except ValueError:
        return None
    return DateMention(year=year, month=month, day=day, position=match.start())


def _time_fields(match: re.Match[str]) -> DateMention | None:
    groups = match.groupdict()
    if groups.get("word"):
        hour = 12 if groups["word"].lower() == "noon" else 0
        return DateMention(hour=hour, minute=0, second=0, position=match.start())
    hour = int(groups["hour"])
    half = (groups.get("half") or "").lower()
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half == "p" else 0)
    elif hour > 23:
        return None
    minute = int(groups["minute"]) if groups.get("minute") else 0
    second = int(groups["second"]) if groups.get("second") else 0
    return DateMention(hour=hour, minute=minute, second=second, position=match.start())


# ---- the spelling a parameter asks for --------------------------------------------------------

_STRFTIME = re.compile(r"%[YmdHMSIpyBbjf](?:[^A-Za-z%'\"\s]{0,3}%[YmdHMSIpyBbjf]|\s%[HIMp])*")
_HUMAN = re.compile(r"YYYY(?P<d>[-/.])MM(?P=d)DD(?:[ T]HH:MM(?::SS)?)?|HH:MM(?::SS)?")
_JSON_FORMATS = {"date": "%Y-%m-%d", "date-time": "%Y-%m-%dT%H:%M:%S", "time": "%H:%M:%S"}
_TIME_DIRECTIVES = ("%H", "%I", "%M", "%S", "%p", "%f")


def value_patterns(schema: Mapping[str, Any]) -> list[str]:
    """The ``strftime`` patterns a string parameter's schema asks its value in, if any: from
    its description (``%Y-%m-%d %H:%M:%S``, ``YYYY-MM-DD``) or its JSON-schema ``format``."""
    description = schema.get("description")
    patterns: list[str] = []
    if isinstance(description, str):
        patterns += _STRFTIME.findall(description)
        patterns += [_from_human(m.group(0)) for m in _HUMAN.finditer(description)]
    json_format = schema.get("format")
    if isinstance(json_format, str) and json_format in _JSON_FORMATS:
        patterns.append(_JSON_FORMATS[json_format])
    return list(dict.fromkeys(patterns))


def _from_human(pattern: str) -> str:
    date, _, time = pattern.partition("HH")
    date = date.replace("YYYY", "%Y").replace("MM", "%m").replace("DD", "%d")
    time = ("HH" + time).replace("HH", "%H").replace("MM", "%M").replace("SS", "%S") \
        if pattern.count("HH") else ""
    return date + time


class DateValue(NamedTuple):
    text: str
    complete: bool  # the whole value; else only its start (the date of a date-and-time value)


def render(mention: DateMention, pattern: str, year: int | None) -> DateValue | None:
    """``mention`` written in ``pattern``, its missing year taken as ``year``. Without a time it
    is written up to the pattern's first time field (an incomplete value); None when the
    mention lacks what the pattern starts with."""
    cut = min((pattern.find(d) for d in _TIME_DIRECTIVES if d in pattern), default=len(pattern))
    date_part = cut > 0
    if date_part and (not mention.has_date or (mention.year or year) is None):
        return None
    complete = mention.has_time or cut == len(pattern)
    if not complete:
        if not date_part:
            return None
        pattern = pattern[:cut]
    moment = datetime(mention.year or year or 2000, mention.month or 1, mention.day or 1,
                      mention.hour or 0, mention.minute or 0, mention.second or 0)
    return DateValue(moment.strftime(pattern), complete)


def date_values(text: str) -> list[DateMention]:
    """The dates and times that open a quoted string of ``text`` (a tool call's values; a date
    inside free text, a message say, is not one)."""
    return [m for m in find_date_mentions(text) if text[m.position - 1: m.position] == '"']


def mentions_written(mentions: Sequence[DateMention], text: str) -> frozenset[int]:
    """Indices of ``mentions`` that ``text`` (a tool call so far) already holds as a value: one
    of its ``date_values`` agrees with every field the mention has."""
    written = date_values(text)
    fields = ("year", "month", "day", "hour", "minute")
    return frozenset(
        index for index, mention in enumerate(mentions)
        if any(all(getattr(mention, f) is None or getattr(mention, f) == getattr(w, f)
                   for f in fields) for w in written))


# Digits per numeric directive; minutes, seconds and fractions default to zeros.
_FIELD_WIDTHS = {"%Y": 4, "%m": 2, "%d": 2, "%H": 2, "%I": 2, "%M": 2, "%S": 2, "%y": 2,
                 "%j": 3, "%f": 6}
_ZERO_FIELDS = ("%M", "%S", "%f")
_DIRECTIVE = re.compile(r"%.")


def complete_in_pattern(typed: str, pattern: str) -> DateValue | None:
    """The rest of a value written in ``pattern`` of which ``typed`` is the start: literal
    separators, and zeros for minute, second and fraction fields not yet begun (or begun
    with zeros), up to the first field it cannot know. ``complete`` when it reaches the
    pattern's end; None when ``typed`` does not fit the pattern, the pattern has a field of
    varying width (month names, AM/PM), or nothing can be added."""
    pieces = [piece for piece in re.split(r"(%.)", pattern) if piece]
    if any(_DIRECTIVE.fullmatch(p) and p not in _FIELD_WIDTHS for p in pieces):
        return None
    at, rest = 0, ""
    for index, piece in enumerate(pieces):
        if at < len(typed):  # still matching what was typed
            if piece in _FIELD_WIDTHS:
                digits = typed[at: at + _FIELD_WIDTHS[piece]]
                if not digits.isdigit():
                    return None
                at += len(digits)
                if len(digits) < _FIELD_WIDTHS[piece]:  # the model is inside this field
                    if piece not in _ZERO_FIELDS or digits.strip("0"):
                        return None
                    rest = "0" * (_FIELD_WIDTHS[piece] - len(digits))
                continue
            overlap = typed[at: at + len(piece)]
            if not piece.startswith(overlap):
                return None
            at += len(overlap)
            rest = piece[len(overlap):]
            continue
        if piece in _FIELD_WIDTHS and piece not in _ZERO_FIELDS:
            return DateValue(rest, False) if rest else None
        rest += "0" * _FIELD_WIDTHS[piece] if piece in _FIELD_WIDTHS else piece
        if index == len(pieces) - 1:
            return DateValue(rest, True)
    return DateValue(rest, True) if at == len(typed) else None  # else typed ran past it
