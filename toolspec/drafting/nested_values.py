"""What may come next inside an object or array argument, from the schema inside it.

A parameter typed ``array`` of numbers or strings, or ``object`` with its own properties, is
written by the model one element at a time: ``"pointA": [3, 4]``, ``"attendees": ["Robert
Lee", "Anna Zhang"]``, ``"budget": {"min": 300000, "max": 400000}``. ``NestedValueGrammar``
continues such a value from where the scanner's anchor left off inside it: the brackets,
commas, keys and closing the schema fixes, and element values from a ``ScalarValues`` source
(the conversation's numbers and names, enum members). Each element value is a choice point;
"another element or the end" splits a branch without counting as one, and a branch out of
choices stops there, or closes the array it is in. A branch that closes the outermost bracket
says so, and the caller goes on with the rest of the call.

Pure text; no tokenizer, no model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toolspec.calls.formats import JsonStyle, NestedAnchor, NestedContainer
from toolspec.calls.tools import json_type
from toolspec.drafting.text_drafts import CLOSE, ELEMENT, FIXED, PARAM, Segment, scaled

Schema = Mapping[str, Any]
# Values offered per element: each one multiplies the branches of the elements after it.
_MAX_ELEMENT_OPTIONS = 3
# A continuation inside the value, and whether it closes the value's outermost bracket.
NestedBranch = tuple[tuple[Segment, ...], bool]


class ScalarValues(Protocol):
    """Likely scalar values of an element, as JSON text with priors summing to at most 1."""

    def scalar_values(self, schema: Schema, name: str,
                      taken: frozenset[str]) -> list[tuple[str, float]]:
        """Values for an element with ``schema``, whose nearest key or parameter is ``name``;
        none of ``taken`` (values an earlier element of the same branch already uses)."""

    def typed_scalar_values(self, schema: Schema, partial: str,
                            in_string: bool) -> list[tuple[str, float]]:
        """Whole values (JSON text) that begin with ``partial``, the string's characters or the
        literal's typed so far."""


@dataclass(frozen=True)
class NestedPriors:
    another_element: float = 0.5  # an array goes on after an element (else it closes)
    next_required: float = 0.85  # an object's next required key in schema order
    close_when_complete: float = 0.6  # an object closes once no required keys are left


@dataclass(frozen=True)
class _Open:
    """An open container of a branch being drafted."""

    schema: Schema
    is_object: bool
    keys: tuple[str, ...] = ()
    key: str | None = None


@dataclass(frozen=True)
class Typing:
    """The element being typed at the anchor: its characters so far, and whether it is a
    string (its opening quote typed) or a literal."""

    partial: str
    in_string: bool


class NestedValueGrammar:
    """Continuations of an object or array parameter value, in one JSON ``style``.

    ``base_level`` is the nesting level of the arguments object (its keys are indented one
    level deeper). Arrays are drafted on one line (``[3, 4]``) whatever the style, as models
    write them; objects follow the style's layout. Stateless between calls.
    """

    def __init__(self, values: ScalarValues, style: JsonStyle, base_level: int,
                 priors: NestedPriors = NestedPriors()) -> None:
        self.values = values
        self.style = style
        self.base_level = base_level
        self.priors = priors
        self._item_separator = style.inline_comma

    def from_value_start(self, schema: Schema, parameter: str, depth: int) -> list[NestedBranch]:
        """From just after a parameter's colon (and its spacing): an object or array value."""
        if json_type(schema) not in ("object", "array"):
            return []
        return self._element((), schema, parameter, depth, frozenset(), None)

    def from_anchor(self, schema: Schema, parameter: str,
                    containers: Sequence[NestedContainer], typing: Typing | None,
                    depth: int) -> list[NestedBranch]:
        """From the scanner's anchor inside the value of ``parameter`` (with ``schema``), whose
        open ``containers`` are given outermost first; ``typing`` is the element being typed
        after the anchor, if any."""
        if not containers:
            return []
        path: list[_Open] = []
        child: Schema = schema
        for container in containers:
            path.append(_Open(child, container.is_object, container.keys, container.key))
            child = _child_schema(child, container.is_object, container.key)
        inner, opened = containers[-1], tuple(path)
        taken = frozenset(inner.scalars)
        if inner.anchor is NestedAnchor.OPENED and inner.is_object:
            return self._keys(opened, parameter, depth, first=True)
        if inner.anchor is NestedAnchor.OPENED:
            return self._element(opened, child, parameter, depth, taken, typing)
        if inner.anchor is NestedAnchor.AFTER_KEY:
            value = self._element(opened, child, parameter, depth, taken, typing)
            return _prefixed(Segment(self.style.colon, FIXED), value)
        return self._after_element(opened, parameter, depth, taken, typing)

    # ---- pieces, each written from the position its name says ----------------------------
    # ``path`` holds the open containers (outermost first), ``depth`` the choice points a
    # branch may still pass, ``taken`` the scalar values the branch has used in this container.

    def _element(self, path: tuple[_Open, ...], schema: Schema, parameter: str, depth: int,
                 taken: frozenset[str], typing: Typing | None) -> list[NestedBranch]:
        """An element's value: a container opened, or a choice among scalar values."""
        kind = json_type(schema)
        if kind == "object":
            inner = (*path, _Open(schema, True))
            return _prefixed(Segment("{", FIXED), self._keys(inner, parameter, depth, first=True))
        if kind == "array":
            inner = (*path, _Open(schema, False))
            items = _child_schema(schema, False, None)
            return _prefixed(Segment("[", FIXED),
                             self._element(inner, items, parameter, depth, frozenset(), None))
        if depth <= 0:
            return [((), False)]
        options = list(self.values.scalar_values(schema, _nearest_name(path, parameter), taken))
        if typing is not None:
            options += self.values.typed_scalar_values(schema, typing.partial, typing.in_string)
            typed = json.dumps(typing.partial, ensure_ascii=False)[:-1] if typing.in_string \
                else typing.partial
            options = [(text, prior) for text, prior in options if text.startswith(typed)]
        best: dict[str, float] = {}
        for text, prior in options:
            best[text] = max(prior, best.get(text, 0.0))  # offered twice: its likelier reason
        branches: list[NestedBranch] = []
        likeliest = sorted(best.items(), key=lambda option: -option[1])[:_MAX_ELEMENT_OPTIONS]
        for text, prior in likeliest:
            rest = self._after_element(path, parameter, depth - 1, taken | {text}, None) \
                if path else [((), True)]
            if typing is not None and text == typing.partial:
                # The literal typed so far ends here: what is uncertain is the bracket or comma
                # after it (a segment typed in full no longer counts).
                branches += [((Segment(text, ELEMENT), *scaled(segments, prior)), closes)
                             for segments, closes in rest]
            else:
                branches += _prefixed(Segment(text, ELEMENT, prior), rest)
        return branches

    def _after_element(self, path: tuple[_Open, ...], parameter: str, depth: int,
                       taken: frozenset[str], typing: Typing | None) -> list[NestedBranch]:
        """From just after an element of ``path[-1]``: another one, or its closing bracket."""
        inner = path[-1]
        if inner.is_object:
            return self._keys(path, parameter, depth, first=False, taken=taken)
        close = self._close(path, parameter, depth, 1 - self.priors.another_element)
        if depth <= 0:
            return close
        items = _child_schema(inner.schema, False, None)
        more = self._element(path, items, parameter, depth, taken, typing)
        return close + _prefixed(Segment(self._item_separator, FIXED,
                                         self.priors.another_element), more)

    def _keys(self, path: tuple[_Open, ...], parameter: str, depth: int, first: bool,
              taken: frozenset[str] = frozenset()) -> list[NestedBranch]:
        """From just after ``{`` (``first``) or an object's value: a key and its value, or
        the closing brace. Keys come from the object's ``properties``; free-form keys are not
        drafted."""
        inner = path[-1]
        properties = inner.schema.get("properties")
        remaining = [k for k in properties if k not in inner.keys] \
            if isinstance(properties, Mapping) else []
        required = [k for k in remaining if k in (inner.schema.get("required") or ())]
        options: list[tuple[str | None, float]] = []
        if required:
            others = [k for k in remaining if k != required[0]]
            share = self.priors.next_required if others else 1.0
            options = [(required[0], share)] + [(k, (1 - share) / len(others)) for k in others]
        elif remaining:
            share = self.priors.close_when_complete
            options = [(None, share)] + [(k, (1 - share) / len(remaining)) for k in remaining]
        elif isinstance(properties, Mapping):
            options = [(None, 1.0)]
        gap = self.style.opening_gap(self.base_level + len(path)) if first \
            else self.style.separator(self.base_level + len(path))
        if not isinstance(properties, Mapping):
            # Free-form keys are not drafted, only the layout up to the next key's quote.
            if first:
                return [((Segment(gap + '"', FIXED),), False)]
            if depth <= 0:
                return [((), False)]
            share = self.priors.close_when_complete
            return [((Segment(gap + '"', FIXED, 1 - share),), False),
                    *self._close(path, parameter, depth - 1, share)]
        chosen = depth - 1 if len(options) > 1 else depth
        if chosen < 0:
            return [((), False)]
        branches: list[NestedBranch] = []
        for key, share in options:
            if key is None:
                branches += self._close(path, parameter, chosen, share, empty=first)
                continue
            head = Segment(gap + json.dumps(key, ensure_ascii=False), PARAM, share)
            entered = (*path[:-1], _Open(inner.schema, True, (*inner.keys, key), key))
            value = self._element(entered, _child_schema(inner.schema, True, key), parameter,
                                  chosen, taken, None)
            branches += _prefixed(head, _prefixed(Segment(self.style.colon, FIXED), value))
        return branches

    def _close(self, path: tuple[_Open, ...], parameter: str, depth: int, prior: float,
               empty: bool = False) -> list[NestedBranch]:
        """``path[-1]``'s closing bracket, then what follows it in its parent (or the end of
        the value, when it is the outermost)."""
        inner = path[-1]
        if inner.is_object:
            gap = "" if empty else self.style.closing_gap(self.base_level + len(path))
            bracket = Segment(gap + "}", CLOSE, prior)
        else:
            bracket = Segment("]", CLOSE, prior)
        if len(path) == 1:
            return [((bracket,), True)]
        return _prefixed(bracket, self._after_element(path[:-1], parameter, depth, frozenset(),
                                                      None))


def _prefixed(head: Segment, branches: list[NestedBranch]) -> list[NestedBranch]:
    return [((head, *segments), closes) for segments, closes in branches]


def _nearest_name(path: Sequence[_Open], parameter: str) -> str:
    """The key an element's value belongs to: the innermost object key, else the parameter."""
    return next((c.key for c in reversed(path) if c.is_object and c.key), parameter)


def _child_schema(schema: Schema, is_object: bool, key: str | None) -> Schema:
    """The schema of an element of a container with ``schema`` (``{}`` when it says none)."""
    if is_object:
        properties = schema.get("properties")
        child = properties.get(key) if isinstance(properties, Mapping) and key else None
    else:
        child = schema.get("items")
    return child if isinstance(child, Mapping) else {}
