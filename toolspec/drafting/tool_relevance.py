"""Which of the offered tools the conversation asks for: a prior over the tool names.

With several tools on offer the grammar cannot know which one the model will call, and an even
split leaves each name a draft the budget may cut. The user's words usually name the tool's
subject ("a 3 bedroom villa for sale within my budget" and ``realestate.find_properties`` —
"Find properties based on location, budget, and specifications"), so each tool is scored by the
conversation words its name and description share, each word weighted by how few of the offered
tools have it (a word every tool has tells them apart not at all); the scores become shares by
a softmax, and half of the probability is then spread evenly (``_EVEN_PART``). A tool the
conversation names already (an earlier turn called it: API-Bank's histories show each call by
name) is rarely the next one called, so its weight is cut to ``_NAMED_BEFORE`` (on API-Bank
level-1 the first call went to such a tool in 14 of the 56 items that had one). Words are
compared by their first letters (``_STEM``), so "properties" meets "property" and "calculate"
meets "calculation". Pure text, no state.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from toolspec.calls.tools import ToolSet

_WORD = re.compile(r"[a-z][a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STEM = 6  # letters a word is compared by
_NAMED_BEFORE = 0.25  # weight of a tool the conversation already names
# Part of the probability spread evenly whatever the words say: the drafter predicts the model,
# not the right answer, and a small model often calls another tool than the one asked for
# (API-Bank level-1: the words pick the model's first call in 50 of 85 items with a choice).
_EVEN_PART = 0.5
# Words too common in tool descriptions and requests to say which tool is meant.
_STOP_WORDS = frozenset(
    "the and for with from that this these those are was were will can may what which who whom "
    "how when where your you our its their them they has have had not but all any each some "
    "get set given based specific specified function api tool data information using use used "
    "returns return value values default optional required please want need would like".split())


def _stems(text: str) -> set[str]:
    words = _WORD.findall(_CAMEL.sub(" ", text).replace("_", " ").replace(".", " ").lower())
    return {word[:_STEM] for word in words if len(word) >= 3 and word not in _STOP_WORDS}


def _names(conversation: str, tool_name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(tool_name)}(?![\w.])", conversation) is not None


def tool_name_shares(tools: ToolSet, conversation: str) -> dict[str, float]:
    """Each tool's share of the probability that it is the one called (summing to 1): a
    softmax of the rarity-weighted conversation words its name and description share, a tool
    the conversation names cut, then half spread evenly. Even shares without a conversation."""
    texts = {tool.name: _stems(f"{tool.name} {tool.description}") for tool in tools}
    if not texts:
        return {}
    named = [name for name in texts if _names(conversation, name)]
    asked = _stems(conversation)
    having = Counter(stem for stems in texts.values() for stem in stems)
    rarity = {stem: math.log(1.0 + len(texts) / count) for stem, count in having.items()}
    # Summed in a fixed order: set order varies between runs, and so would the last bit.
    scores = {name: sum(sorted(rarity[stem] for stem in stems & asked))
              for name, stems in texts.items()}
    top = max(scores.values())
    weights = {name: math.exp(score - top) * (_NAMED_BEFORE if name in named else 1.0)
               for name, score in scores.items()}
    total = sum(weights.values())
    even = _EVEN_PART / len(weights)
    return {name: (1.0 - _EVEN_PART) * weight / total + even for name, weight in weights.items()}
