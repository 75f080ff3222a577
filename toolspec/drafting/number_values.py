"""Numbers the conversation states, spelled the way a JSON argument writes them.

Users write "$300,000", "$1.2M" or "3 million"; a tool call writes 300000, 1200000, 3000000. The
model writes one digit per token, so a number the drafter offers only as "300" and "000" (what
a plain digit pattern reads in "300,000") costs a step per digit it gets wrong. ``stated_numbers``
reads every number of a text once, in order of appearance: thousands separators dropped, a
scale written after it (``k``, ``M``, ``B``/``bn`` attached; ``thousand``, ``million``,
``billion``, ``trillion`` as words) multiplied out, with the number as written kept after the
multiplied one (a tool may take "1.2" with a unit of millions). Each keeps how the text spelled
it, so a caller can find where the conversation mentions it. Pure text, no state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

# A number may end a sentence ("a height of 5."), not run into a word or another number, except
# for a scale written right after it. Digits grouped by threes ("300,000") are one number; a
# list written without spaces ("1,2,3") is several.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<digits>-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)"
    r"(?P<scale>(?:[kK]|M|B|bn)\b|\s(?i:thousand|million|billion|trillion)\b)?(?!\w|\.\d)")
_EXPONENTS = {"k": 3, "m": 6, "b": 9, "bn": 9,
              "thousand": 3, "million": 6, "billion": 9, "trillion": 12}


@dataclass(frozen=True)
class StatedNumber:
    value: str  # as a JSON number: "300000", "1200000", "-25", "0.95"
    spelled: str  # as the text has it: "300,000", "1.2M", "-25"


def stated_numbers(text: str) -> list[StatedNumber]:
    """Every distinct number ``text`` states, in order of first appearance (see the module)."""
    distinct: dict[str, StatedNumber] = {}
    for match in _NUMBER.finditer(text):
        digits = match.group("digits").replace(",", "")
        written = StatedNumber(digits, match.group("digits"))
        scale = match.group("scale")
        if scale:
            scaled = Decimal(digits).scaleb(_EXPONENTS[scale.strip().lower()])
            value = str(int(scaled)) if scaled == scaled.to_integral_value() \
                else format(scaled.normalize(), "f")
            distinct.setdefault(value, StatedNumber(value, match.group(0)))
        distinct.setdefault(written.value, written)
    return list(distinct.values())
