"""What may come next in a tool call, as text: the schema half of the drafting FSM.

Given the scanner's view of the output so far, ``CallGrammar.continuations`` lists candidate
continuations, each written from the scanner's *anchor* (the end of the last completed JSON
element) and made of segments that carry a source and a prior (the chance of that segment given
the ones before it). Fixed schema text has prior 1; a choice among tool names, parameters, enum
members or call endings splits the probability among the options. The caller drops the part the
model has already typed (candidates that disagree with it are dropped entirely), so one code path
serves "just after the colon", "half-way through a tool name" and "between parameters".
Values copied from the conversation come from ``ConversationValues``; inside an object or array
argument, ``NestedValueGrammar`` drafts the elements, with those values (``scalar_values``).

Pure text; no tokenizer, no model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolspec.calls.formats import CallFormat, CallScanner, CallState, JsonStyle
from toolspec.calls.tools import Tool, ToolSet, json_type, pinned_values
from toolspec.drafting.conversation_values import ConversationValues, is_written_number
from toolspec.drafting.date_values import complete_in_pattern, value_patterns
from toolspec.drafting.nested_values import NestedBranch, NestedValueGrammar, Typing
from toolspec.drafting.prompt_literals import NestedLiteral
from toolspec.drafting.text_drafts import (
    CLOSE,
    DATE,
    FIXED,
    LITERAL,
    NAME,
    OPEN,
    PARAM,
    PATTERN,
    VALUE,
    Branch,
    Segment,
    TextDraft,
    quoted_inner,
    scaled,
)
from toolspec.drafting.tool_relevance import tool_name_shares

# Nesting levels of the two objects of a call, for indented styles.
_CALL_LEVEL = 1
_ARGS_LEVEL = 2

@dataclass(frozen=True)
class GrammarPriors:
    """How probability is split at choice points (until learned statistics replace them)."""

    next_required: float = 0.85  # the next required parameter in schema order
    close_when_complete: float = 0.6  # closing the arguments once no required ones are left
    another_call: float = 0.25  # one more call after a finished one
    value_ends_here: float = 0.2  # a string or number value ends right after what is typed
    copied_span: float = 0.3  # a string value continues as a span of the conversation
    number_share: float = 0.5  # a numeric value is the first unused number of the conversation
    string_share: float = 0.3  # a string value is the latest unused name/id/quote of the
                               # conversation
    date_share: float = 0.5  # a value with a date pattern is the latest unused date mentioned
    pattern_rest: float = 0.6  # a date or time being typed goes on as its pattern says


class CallGrammar:
    """Candidate continuations of a tool call in one format, for one tool set.

    ``styles`` are the JSON spacings the model may use, with their probabilities;
    The text before the first call and after the last one is given per query: it is learned
    from the model and, after the last call, depends on how the output opened.
    """

    def __init__(
        self,
        tools: ToolSet,
        call_format: CallFormat,
        priors: GrammarPriors = GrammarPriors(),
        chained_choices: int = 2,
        conversation: str = "",
        literals: Sequence[NestedLiteral] = (),
    ) -> None:
        self.tools = tools
        self.format = call_format
        self.openings: tuple[tuple[str, float], ...] = ()
        self.closings: tuple[tuple[str, float], ...] = ()
        self.priors = priors
        self.chained_choices = chained_choices  # how many choice points one branch runs through
        self.values = ConversationValues(conversation)  # what argument values may copy
        self.literals = tuple(literals)  # the prompt's objects and arrays (nested values)
        self._literal_texts: dict[JsonStyle, list[tuple[str | None, str]]] = {}
        self._name_shares = tool_name_shares(tools, conversation)
        self._assumed_years: tuple[int, ...] = ()
        self._cache: dict[tuple, list[tuple[tuple[Segment, ...], bool, str]]] = {}

    # ---- entry point ----------------------------------------------------------------------

    def continuations(
        self,
        scanner: CallScanner,
        styles: Sequence[tuple[JsonStyle, float]],
        openings: Sequence[tuple[str, float]] | None = None,
        closings: Sequence[tuple[str, float]] | None = None,
        years: Sequence[int] = (),
    ) -> list[TextDraft]:
        """Candidates written from ``scanner.anchor`` that agree with what is typed after it,
        most of them stopping at a choice point the grammar cannot resolve (a free-text
        value). ``styles`` are the JSON spacings to
        draft in; ``openings`` what may precede the first call and ``closings`` what may follow
        the last one (all with probabilities; the format's own text by default); ``years``
        those the model writes dates in when the conversation names none.

        Mutates: a cache of the structural branches, keyed by the scanner's position, and
        which conversation values count as used.
        """
        fmt = self.format
        self.openings = tuple(openings or [(fmt.block_open + fmt.call_open, 1.0)])
        self.closings = tuple(closings or [(fmt.call_close + fmt.block_close, 1.0)])
        self._assumed_years = tuple(years)
        self.values.note_written(scanner.text)
        typed = scanner.text[scanner.anchor:]
        drafts: list[TextDraft] = []
        for style, style_prior in styles:
            key = (scanner.state, scanner.tool_name, scanner.call_keys, scanner.given_parameters,
                   scanner.arguments_open, bool(scanner.calls), scanner.parameter, style,
                   self.values.used, self.values.used_dates, self._assumed_years, self.openings,
                   self.closings)
            structural = self._cache.get(key)
            if structural is None and self._no_opening_agrees(scanner, typed):
                structural = []  # prose that no call opening starts: nothing to build
            if structural is None:
                structural = self._cache[key] = [
                    (segments, ends, "".join(segment.text for segment in segments))
                    for segments, ends in self._branches(scanner, style)]
            # Most structural branches disagree with what is typed (every call opening while
            # the model writes prose): dropped here by one string test each, before they are
            # built into drafts.
            for segments, ends, text in structural:
                if text.startswith(typed):
                    drafts.append(TextDraft(scaled(segments, style_prior), ends))
            for segments, ends in self._typed_value_branches(scanner, style):
                drafts.append(TextDraft(scaled(segments, style_prior), ends))
        return drafts

    def _no_opening_agrees(self, scanner: CallScanner, typed: str) -> bool:
        """Whether the output is text before any call that no opening begins with or is
        begun by (then no branch of the TEXT state can agree with it)."""
        if scanner.state is not CallState.TEXT or scanner.calls:
            return False
        return not any(opening.startswith(typed) or typed.startswith(opening)
                       for opening in (text + "{" for text, _ in self.openings))

    def _branches(self, scanner: CallScanner, style: JsonStyle) -> list[Branch]:
        """Branches determined by the structural position alone (not by typed characters)."""
        state = scanner.state
        depth = self.chained_choices
        if state is CallState.TEXT:
            if scanner.calls:
                return self._after_call(style, depth)
            # The opening is drafted once per output (at the prefill, where tree rows are
            # cheap): one more choice lets the first value ride on it.
            return [((Segment(text + "{", OPEN, prior), *rest), ends)
                    for text, prior in self.openings
                    for rest, ends in self._call_body(style, depth + 1)]
        if state in (CallState.OFF_FORMAT, CallState.VALUE_NESTED):
            return []
        keys = scanner.call_keys
        tool = self.tools.get(scanner.tool_name) if scanner.tool_name else None
        if not scanner.arguments_open:
            if state is CallState.AFTER_ARGS:
                return self._close_call(style, depth)
            if not keys:
                return self._call_body(style, depth)
            if keys[-1] == "name" and scanner.tool_name is None:
                return self._name_value(style, depth)
            if keys[-1] == "name" and tool is not None:
                return self._arguments(tool, style, depth)
            if keys[-1] in scanner.arguments_keys and tool is not None:
                return [((Segment(style.colon + "{", FIXED), *rest), ends)
                        for rest, ends in self._parameters(tool, (), style, depth)]
            return []
        if tool is None:
            return []
        given = scanner.given_parameters
        if state in (CallState.ARGS_START, CallState.PARAM_NAME):
            if not given:
                return self._parameters(tool, given, style, depth)
            return self._after_value(tool, given, style, depth)
        if state is CallState.AFTER_VALUE:
            return self._after_value(tool, given, style, depth)
        if state is CallState.AFTER_ARGS:
            return self._close_call(style, depth)
        if state in (CallState.PARAM_COLON, CallState.VALUE_STRING, CallState.VALUE_LITERAL):
            schema = tool.properties.get(scanner.parameter or "", {})
            if state is CallState.VALUE_STRING and json_type(schema) is None:
                # The model opened a string for a parameter the schema does not type (or
                # does not have): draft it as a string.
                schema = {**schema, "type": "string"}
            return [((Segment(style.colon, FIXED), *rest), ends)
                    for rest, ends in self._value(tool, schema, given, style, depth)]
        return []

    def _typed_value_branches(self, scanner: CallScanner, style: JsonStyle) -> list[Branch]:
        """Branches that depend on the characters of the value being typed."""
        state, partial = scanner.state, scanner.partial
        tool = self.tools.get(scanner.tool_name) if scanner.tool_name else None
        nested_start = scanner.nested_value_start
        if tool is None or not (partial or nested_start is not None):
            return []
        typed = scanner.text[scanner.anchor:]
        given = scanner.given_parameters
        depth = self.chained_choices
        copied = self.priors.copied_span
        if state is CallState.VALUE_NESTED and nested_start is not None:
            return (self._nested_elements(tool, scanner, style, depth)
                    + self._copied_literals(tool, scanner.parameter, given, typed,
                                            scanner.text[nested_start:], style, depth))
        if state is CallState.VALUE_STRING:
            return (self._value_ends_now(tool, given, typed, state, style, depth)
                    + self._typed_goes_on(self.values.spans_going_on(partial, copied), True,
                                          tool, given, typed, partial, style, depth)
                    + self._typed_year_dates(tool, scanner.parameter, given, typed, partial,
                                             style, depth)
                    + self._pattern_rest(tool, scanner.parameter, given, typed, partial, style,
                                         depth))
        if state is CallState.VALUE_LITERAL and partial[:1] in "-0123456789":
            return (self._value_ends_now(tool, given, typed, state, style, depth)
                    + self._typed_goes_on(self.values.numbers_going_on(partial, copied), False,
                                          tool, given, typed, partial, style, depth))
        return []

    # ---- grammar pieces (each returns branches written from the relevant anchor) ---------

    def _call_body(self, style: JsonStyle, depth: int) -> list[Branch]:
        """From just after a call's ``{``: the name key, then the name."""
        head = Segment(style.opening_gap(_CALL_LEVEL) + '"name"', FIXED)
        return [((head, *rest), ends) for rest, ends in self._name_value(style, depth)]

    def _name_value(self, style: JsonStyle, depth: int) -> list[Branch]:
        """From just after the ``"name"`` key: every tool name (as likely as the conversation
        asks for it), then its arguments."""
        branches: list[Branch] = []
        for tool in self.tools:
            share = self._name_shares[tool.name]
            head = (Segment(style.colon + '"', FIXED),
                    Segment(quoted_inner(tool.name), NAME, share),
                    Segment('"', FIXED))
            for rest, ends in self._arguments(tool, style, depth - 1):
                branches.append(((*head, *rest), ends))
        return branches

    def _arguments(self, tool: Tool, style: JsonStyle, depth: int) -> list[Branch]:
        """From just after the tool name's closing quote."""
        opener = Segment(f'{style.separator(_CALL_LEVEL)}"{self.format.arguments_key}"'
                         f'{style.colon}{{', FIXED)
        if depth <= 0:
            return [((opener,), False)]
        return [((opener, *rest), ends) for rest, ends in self._parameters(tool, (), style, depth)]

    def _parameters(self, tool: Tool, given: Sequence[str], style: JsonStyle,
                    depth: int) -> list[Branch]:
        """From just after ``{`` or a comma in the arguments: a parameter name, or the end."""
        remaining = [name for name in tool.parameter_order() if name not in given]
        required = [name for name in remaining if name in tool.required]
        options: list[tuple[str | None, float]] = []
        if required:
            others = [name for name in remaining if name != required[0]]
            first_share = self.priors.next_required if others else 1.0
            options.append((required[0], first_share))
            options += [(name, (1 - first_share) / len(others)) for name in others]
        else:
            close_share = self.priors.close_when_complete if remaining else 1.0
            options.append((None, close_share))
            options += [(name, (1 - close_share) / len(remaining)) for name in remaining]
        branches: list[Branch] = []
        # Right after ``{`` (nothing given yet) the first key follows the opening gap; after a
        # value, ``_after_value`` puts the separator in front.
        gap = style.opening_gap(_ARGS_LEVEL) if not given else ""
        for name, share in options:
            if name is None:
                for rest, ends in self._close_arguments(style, depth, empty=not given):
                    branches.append((scaled(rest, share), ends))
                continue
            head = Segment(gap + json.dumps(name, ensure_ascii=False), PARAM, share)
            schema = tool.properties.get(name, {})
            after_key = [((Segment(style.colon, FIXED), *rest), ends)
                         for rest, ends in self._value(tool, schema, (*given, name), style,
                                                       depth - 1)]
            branches += [((head, *rest), ends) for rest, ends in after_key]
        return branches

    def _value(self, tool: Tool, schema: Mapping[str, Any], given: Sequence[str],
               style: JsonStyle, depth: int) -> list[Branch]:
        """From just after a parameter's colon: what the schema says about its value.

        ``given`` already includes the parameter."""
        literals = pinned_values(schema)
        if literals:
            share = 1.0 / len(literals)
            branches: list[Branch] = []
            for literal in literals:
                value = Segment(json.dumps(literal, ensure_ascii=False), VALUE, share)
                if depth <= 0:
                    branches.append(((value,), False))
                    continue
                branches += self._then_next((value,), tool, given, style, depth - 1)
            return branches
        kind = json_type(schema)
        if kind == "string":
            opener = Segment('"', FIXED)
            branches = [((opener,), False)]
            if depth > 0:
                branches += [((opener, *rest), ends) for rest, ends
                             in self._dates_in_pattern(tool, schema, given, style, depth, None)]
            for span, share in self.values.strings_for(given[-1] if given else "",
                                                       self.priors.string_share) \
                    if depth > 0 else ():
                value = Segment(quoted_inner(span) + '"', VALUE, share)
                branches += self._then_next((opener, value), tool, given, style, depth - 1)
            return branches
        branches = [((), False)]  # a free value: the draft stops after the colon
        if kind in ("object", "array") and depth > 0:
            nested = NestedValueGrammar(self, style, _ARGS_LEVEL)
            branches += self._after_nested(
                nested.from_value_start(schema, given[-1] if given else "", depth),
                tool, given, style)
        if kind in ("integer", "number") and depth > 0:
            for number, share in self.values.numbers_for(given[-1] if given else "",
                                                         kind == "integer",
                                                         self.priors.number_share):
                value = Segment(number, VALUE, share)
                branches += self._then_next((value,), tool, given, style, depth - 1)
        return branches

    def _dates_in_pattern(self, tool: Tool, schema: Mapping[str, Any], given: Sequence[str],
                          style: JsonStyle, depth: int, year: int | None) -> list[Branch]:
        """From just after a string value's opening quote: the conversation's unused dates
        written in the pattern the schema asks for, the latest message's first, with
        geometrically decreasing priors. A date without a time stops before the time fields.
        ``year`` stands in for a year the conversation leaves out (else ``_default_year``)."""
        dates = self.values.dates_written(value_patterns(schema) if self.values.dates else [],
                                          year if year is not None else self._default_year())
        branches: list[Branch] = []
        for rank, (text, complete) in enumerate(dates):
            share = self.priors.date_share * 0.5 ** rank
            if not complete:
                branches.append(((Segment(quoted_inner(text), DATE, share),), False))
                continue
            value = Segment(quoted_inner(text) + '"', DATE, share)
            branches += self._then_next((value,), tool, given, style, depth - 1)
        return branches

    def _default_year(self) -> int | None:
        """The year of dates said without one: the conversation's latest, else the one the
        model has been writing."""
        return next(iter(self.values.years or self._assumed_years), None)

    def _typed_year_dates(self, tool: Tool, parameter: str | None, given: Sequence[str],
                          typed: str, partial: str, style: JsonStyle, depth: int) -> list[Branch]:
        """The conversation's dates in the year the model has just written (when the
        conversation gives no year, or another one)."""
        match = _TYPED_YEAR.match(partial)
        if match is None or int(match.group(1)) == self._default_year():
            return []
        schema = tool.properties.get(parameter or "", {})
        prefix = typed[: len(typed) - len(partial)]
        return [((Segment(prefix, FIXED), *rest), ends) for rest, ends in self._dates_in_pattern(
            tool, schema, given, style, depth, int(match.group(1)))]

    def _nested_elements(self, tool: Tool, scanner: CallScanner, style: JsonStyle,
                         depth: int) -> list[Branch]:
        """Inside an object or array value: its elements as the parameter's schema describes
        them (``NestedValueGrammar``), then the rest of the call once it closes."""
        parameter = scanner.parameter or ""
        typing = Typing(scanner.partial, scanner.typing_string) \
            if (scanner.partial or scanner.typing_string) and not scanner.typing_key else None
        nested = NestedValueGrammar(self, style, _ARGS_LEVEL)
        return self._after_nested(
            nested.from_anchor(tool.properties.get(parameter, {}), parameter,
                               scanner.nested_containers, typing, depth),
            tool, scanner.given_parameters, style)

    def _after_nested(self, branches: Sequence[NestedBranch], tool: Tool, given: Sequence[str],
                      style: JsonStyle) -> list[Branch]:
        """Nested-value ``branches``, those that close the value followed by the next
        parameter's name (or the end of the arguments)."""
        out: list[Branch] = []
        for segments, closes in branches:
            if closes:
                out += self._then_next(segments, tool, given, style, 0)
            elif segments:
                out.append((segments, False))
        return out

    # ``ScalarValues`` for the nested-value grammar (element values inside objects and arrays):
    # the same conversation values as a parameter's, as JSON text.

    def scalar_values(self, schema: Mapping[str, Any], name: str,
                      taken: frozenset[str]) -> list[tuple[str, float]]:
        known = [json.dumps(v, ensure_ascii=False) for v in pinned_values(schema)]
        if known:
            # An enum member rarely repeats in one list (but a list of booleans may).
            fresh = [text for text in known if text not in taken] or known
            return [(text, 1.0 / len(fresh)) for text in fresh]
        kind = json_type(schema)
        strings = [(f'"{quoted_inner(span)}"', prior)
                   for span, prior in self.values.strings_for(name, self.priors.string_share)] \
            if kind in ("string", None) else []
        numbers = self.values.numbers_for(name, kind == "integer", self.priors.number_share) \
            if kind in ("integer", "number", None) else []
        untyped_share = 0.5 if kind is None else 1.0  # strings or numbers: split between them
        return [(text, prior * untyped_share) for text, prior in strings + numbers
                if text not in taken]

    def typed_scalar_values(self, schema: Mapping[str, Any], partial: str,
                            in_string: bool) -> list[tuple[str, float]]:
        copied = self.priors.copied_span
        if in_string:
            # Unlike a parameter's string, an element's is not drafted to end at any point:
            # inside a list, that guess costs more nodes than it wins.
            return [(f'"{quoted_inner(span)}"', share)
                    for span, share in self.values.spans_going_on(partial, copied)]
        values = self.values.numbers_going_on(partial, copied)
        if is_written_number(partial):
            values.append((partial, self.priors.value_ends_here))
        return values

    def _copied_literals(self, tool: Tool, parameter: str | None, given: Sequence[str],
                         typed: str, nested: str, style: JsonStyle, depth: int) -> list[Branch]:
        """The object or array being typed (``nested``, from its bracket) is one the prompt
        spells out, laid out as the model writes an argument's value: the one the prompt keys
        by this parameter (its schema) first, then the latest."""
        texts = self._literal_texts.get(style)
        if texts is None:
            texts = self._literal_texts[style] = [
                (literal.key, style.dumps_at(literal.value, _ARGS_LEVEL + 1))
                for literal in reversed(self.literals)]
        matching = [(key != parameter, text) for key, text in texts
                    if len(text) > len(nested) and text.startswith(nested)]
        chosen = list(dict.fromkeys(text for _, text in sorted(matching, key=lambda m: m[0])))
        chosen = chosen[:_MAX_LITERALS]
        branches: list[Branch] = []
        for rank, text in enumerate(chosen):
            head = Segment(typed + text[len(nested):], LITERAL,
                           self.priors.copied_span * 0.5 ** rank)
            branches += self._then_next((head,), tool, given, style, depth)
        return branches

    def _pattern_rest(self, tool: Tool, parameter: str | None, given: Sequence[str],
                      typed: str, partial: str, style: JsonStyle, depth: int) -> list[Branch]:
        """The date or time being typed, continued as the parameter's pattern goes on (its
        separators, zero minutes and seconds) and closed where the pattern ends."""
        schema = tool.properties.get(parameter or "", {})
        branches: list[Branch] = []
        for pattern in value_patterns(schema):
            rest = complete_in_pattern(partial, pattern)
            if rest is None:
                continue
            head = Segment(typed + quoted_inner(rest.text) + ('"' if rest.complete else ""),
                           PATTERN, self.priors.pattern_rest)
            if not rest.complete:
                branches.append(((head,), False))
                continue
            branches += self._then_next((head,), tool, given, style, depth)
        return branches

    def _value_ends_now(self, tool: Tool, given: Sequence[str], typed: str, state: CallState,
                        style: JsonStyle, depth: int) -> list[Branch]:
        """The value being typed ends right here (copied to the end of what is typed)."""
        closer = '"' if state is CallState.VALUE_STRING else ""
        if typed.endswith("\\") and closer:
            return []  # inside an escape: a quote here would be part of the string
        head = Segment(typed + closer, VALUE, self.priors.value_ends_here)
        return self._then_next((head,), tool, given, style, depth)

    def _typed_goes_on(self, values: Sequence[tuple[str, float]], in_string: bool, tool: Tool,
                       given: Sequence[str], typed: str, partial: str, style: JsonStyle,
                       depth: int) -> list[Branch]:
        """The value being typed (``partial``, a string's characters if ``in_string``) is one
        of ``values`` that start with it, closed and followed by the rest of the call."""
        branches: list[Branch] = []
        for value, share in values:
            rest = value[len(partial):]
            if in_string:
                rest = quoted_inner(rest) + '"'
            branches += self._then_next((Segment(typed + rest, VALUE, share),), tool, given,
                                        style, depth)
        return branches

    def _then_next(self, value: tuple[Segment, ...], tool: Tool, given: Sequence[str],
                   style: JsonStyle, depth: int) -> list[Branch]:
        """``value`` (a parameter's value, closed) followed by each way to go on after it."""
        return [((*value, *rest), ends)
                for rest, ends in self._after_value(tool, given, style, depth)]

    def _after_value(self, tool: Tool, given: Sequence[str], style: JsonStyle,
                     depth: int) -> list[Branch]:
        """From just after a parameter value: a comma and the next parameter, or the end."""
        branches: list[Branch] = []
        for rest, ends in self._parameters(tool, given, style, depth):
            if rest and rest[0].source == CLOSE:
                branches.append((rest, ends))  # closing needs no comma
            else:
                branches.append(((Segment(style.separator(_ARGS_LEVEL), FIXED), *rest), ends))
        return branches

    def _close_arguments(self, style: JsonStyle, depth: int, empty: bool) -> list[Branch]:
        """From inside the arguments, once they are complete: ``}`` and the call's end."""
        close = Segment(("" if empty else style.closing_gap(_ARGS_LEVEL)) + "}", CLOSE)
        return [((close, *rest), ends) for rest, ends in self._close_call(style, depth)]

    def _close_call(self, style: JsonStyle, depth: int) -> list[Branch]:
        """From just after the arguments' ``}``: the call's ``}``, then what follows the call."""
        close = Segment(style.closing_gap(_CALL_LEVEL) + "}", CLOSE)
        return [((close, *rest), ends) for rest, ends in self._after_call(style, depth)]

    def _after_call(self, style: JsonStyle, depth: int) -> list[Branch]:
        """From just after a call's ``}``: the end of the output, or another call."""
        end_share = 1 - self.priors.another_call
        branches: list[Branch] = [((Segment(text, CLOSE, end_share * prior),), True)
                                  for text, prior in self.closings]
        between = Segment(self.format.call_close + self.format.separator + self.format.call_open
                          + "{", OPEN, self.priors.another_call)
        if depth > 0:
            branches += [((between, *rest), ends)
                         for rest, ends in self._call_body(style, depth - 1)]
        else:
            branches.append(((between,), False))
        return branches


_MAX_LITERALS = 3
_TYPED_YEAR = re.compile(r"((?:19|20)\d\d)\b")
