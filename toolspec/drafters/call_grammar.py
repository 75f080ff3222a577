"""What may come next in a tool call, as text: the schema half of the drafting FSM.

Given the scanner's view of the output so far, ``CallGrammar.continuations`` lists candidate
continuations, each written from the scanner's *anchor* (the end of the last completed JSON
element) and made of segments that carry a source and a prior (the chance of that segment given
the ones before it). Fixed schema text has prior 1; a choice among tool names, parameters, enum
members or call endings splits the probability among the options. The caller drops the part the
model has already typed (candidates that disagree with it are dropped entirely), so one code path
serves "just after the colon", "half-way through a tool name" and "between parameters".
Inside an object or array argument, ``NestedValueGrammar`` drafts the elements from the schema
inside it, with this grammar's conversation values (``scalar_values``) as their candidates.

Pure text; no tokenizer, no model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolspec.drafters.date_values import (DateMention, complete_in_pattern,
                                           find_date_mentions, mentions_written, render,
                                           value_patterns)
from toolspec.drafters.nested_values import NestedBranch, NestedValueGrammar, Typing
from toolspec.drafters.number_values import stated_numbers
from toolspec.drafters.prompt_literals import NestedLiteral
from toolspec.drafters.text_drafts import (CLOSE, DATE, FIXED, LITERAL, NAME, OPEN, PARAM,
                                           PATTERN, VALUE, Branch, Segment, TextDraft, scaled)
from toolspec.drafters.tool_relevance import tool_name_shares
from toolspec.formats import CallFormat, CallScanner, CallState, JsonStyle
from toolspec.tools import Tool, ToolSet, json_type

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
    string_share: float = 0.3  # a string value is the latest unused name/id/quote of the conversation
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
        self.conversation = conversation  # text that argument values may be copied from
        self.literals = tuple(literals)  # the prompt's objects and arrays (nested values)
        self._literal_texts: dict[JsonStyle, list[tuple[str | None, str]]] = {}
        stated = stated_numbers(conversation)
        self._numbers = [number.value for number in stated]
        self._number_spellings = {number.value: number.spelled for number in stated}
        self._strings = _value_like_spans(conversation)
        self._strings_ranked: dict[str, list[str]] = {}  # per parameter: ``_ranked_for``
        self._numbers_ranked: dict[str, list[str]] = {}
        self._name_shares = tool_name_shares(tools, conversation)
        self._used_values: frozenset[str] = frozenset()
        self._dates = _latest_message_first(find_date_mentions(conversation), conversation)
        self._years = list(dict.fromkeys(m.year for m in self._dates if m.year))  # latest first
        self._used_dates: frozenset[int] = frozenset()
        self._assumed_years: tuple[int, ...] = ()
        self._cache: dict[tuple, list[Branch]] = {}

    # ---- entry point ----------------------------------------------------------------------

    def continuations(
        self,
        scanner: CallScanner,
        styles: Sequence[tuple[JsonStyle, float]],
        openings: Sequence[tuple[str, float]] | None = None,
        closings: Sequence[tuple[str, float]] | None = None,
        years: Sequence[int] = (),
    ) -> list[TextDraft]:
        """Candidates written from ``scanner.anchor``, most of them stopping at a choice point
        the grammar cannot resolve (a free-text value). ``styles`` are the JSON spacings to
        draft in; ``openings`` what may precede the first call and ``closings`` what may follow
        the last one (all with probabilities; the format's own text by default); ``years``
        those the model writes dates in when the conversation names none.

        Mutates: a cache of the structural branches, keyed by the scanner's position.
        """
        fmt = self.format
        self.openings = tuple(openings or [(fmt.block_open + fmt.call_open, 1.0)])
        self.closings = tuple(closings or [(fmt.call_close + fmt.block_close, 1.0)])
        self._assumed_years = tuple(years)
        numbers_written = set(_NUMBER.findall(scanner.text))
        self._used_values = frozenset(
            [n for n in self._numbers if n in numbers_written]
            + [s for s in self._strings if f'"{_quoted_inner(s)}"' in scanner.text])
        self._used_dates = mentions_written(self._dates, scanner.text) if self._dates \
            else frozenset()
        drafts: list[TextDraft] = []
        for style, style_prior in styles:
            key = (scanner.state, scanner.tool_name, scanner.call_keys, scanner.given_parameters,
                   scanner.arguments_open, bool(scanner.calls), scanner.parameter, style,
                   self._used_values, self._used_dates, self._assumed_years, self.openings,
                   self.closings)
            structural = self._cache.get(key)
            if structural is None:
                structural = self._cache[key] = self._branches(scanner, style)
            for segments, ends in structural + self._typed_value_branches(scanner, style):
                drafts.append(TextDraft(scaled(segments, style_prior), ends))
        return drafts

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
        if state is CallState.VALUE_NESTED and nested_start is not None:
            return (self._nested_elements(tool, scanner, style, depth)
                    + self._copied_literals(tool, scanner.parameter, given, typed,
                                            scanner.text[nested_start:], style, depth))
        if state is CallState.VALUE_STRING:
            return (self._value_ends_now(tool, given, typed, state, style, depth)
                    + self._copied_spans(tool, given, typed, partial, style, depth)
                    + self._typed_year_dates(tool, scanner.parameter, given, typed, partial,
                                             style, depth)
                    + self._pattern_rest(tool, scanner.parameter, given, typed, partial, style,
                                         depth))
        if state is CallState.VALUE_LITERAL and partial[:1] in "-0123456789":
            return (self._value_ends_now(tool, given, typed, state, style, depth)
                    + self._copied_numbers(tool, given, typed, partial, style, depth))
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
            head = (Segment(style.colon + '"', FIXED), Segment(_quoted_inner(tool.name), NAME, share),
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
        literals = _known_values(schema)
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
            for span, share in self._conversation_strings(given[-1] if given else "") \
                    if depth > 0 else ():
                value = Segment(_quoted_inner(span) + '"', VALUE, share)
                branches += self._then_next((opener, value), tool, given, style, depth - 1)
            return branches
        branches = [((), False)]  # a free value: the draft stops after the colon
        if kind in ("object", "array") and depth > 0:
            nested = NestedValueGrammar(self, style, _ARGS_LEVEL)
            branches += self._after_nested(
                nested.from_value_start(schema, given[-1] if given else "", depth),
                tool, given, style)
        if kind in ("integer", "number") and depth > 0:
            for number, share in self._conversation_numbers(given[-1] if given else "",
                                                             kind == "integer"):
                value = Segment(number, VALUE, share)
                branches += self._then_next((value,), tool, given, style, depth - 1)
        return branches

    def _dates_in_pattern(self, tool: Tool, schema: Mapping[str, Any], given: Sequence[str],
                          style: JsonStyle, depth: int, year: int | None) -> list[Branch]:
        """From just after a string value's opening quote: the conversation's unused dates
        written in the pattern the schema asks for, the latest message's first, with
        geometrically decreasing priors. A date without a time stops before the time fields.
        ``year`` stands in for a year the conversation leaves out (else ``_default_year``)."""
        patterns = value_patterns(schema) if self._dates else []
        years = [year if year is not None else self._default_year()]
        values = list(dict.fromkeys(
            value for index, mention in enumerate(self._dates) if index not in self._used_dates
            for pattern in patterns for candidate_year in years
            if (value := render(mention, pattern, candidate_year)) is not None))
        branches: list[Branch] = []
        for rank, (text, complete) in enumerate(values[:_MAX_DATES]):
            share = self.priors.date_share * 0.5 ** rank
            if not complete:
                branches.append(((Segment(_quoted_inner(text), DATE, share),), False))
                continue
            value = Segment(_quoted_inner(text) + '"', DATE, share)
            branches += self._then_next((value,), tool, given, style, depth - 1)
        return branches

    def _default_year(self) -> int | None:
        """The year of dates said without one: the conversation's latest, else the one the
        model has been writing."""
        return next(iter(self._years or self._assumed_years), None)

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
        known = [json.dumps(v, ensure_ascii=False) for v in _known_values(schema)]
        if known:
            # An enum member rarely repeats in one list (but a list of booleans may).
            fresh = [text for text in known if text not in taken] or known
            return [(text, 1.0 / len(fresh)) for text in fresh]
        kind = json_type(schema)
        strings = [(f'"{_quoted_inner(span)}"', prior)
                   for span, prior in self._conversation_strings(name)] \
            if kind in ("string", None) else []
        numbers = self._conversation_numbers(name, kind == "integer") \
            if kind in ("integer", "number", None) else []
        untyped_share = 0.5 if kind is None else 1.0  # strings or numbers: split between them
        return [(text, prior * untyped_share) for text, prior in strings + numbers
                if text not in taken]

    def typed_scalar_values(self, schema: Mapping[str, Any], partial: str,
                            in_string: bool) -> list[tuple[str, float]]:
        if in_string:
            # Unlike a parameter's string, an element's is not drafted to end at any point:
            # inside a list, that guess costs more nodes than it wins.
            return [(f'"{_quoted_inner(span)}"', share)
                    for span, share in self._typed_spans(partial)]
        values = self._typed_numbers(partial)
        if _NUMBER.fullmatch(partial):
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
        chosen = chosen[:_MAX_SPANS]
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
            head = Segment(typed + _quoted_inner(rest.text) + ('"' if rest.complete else ""),
                           PATTERN, self.priors.pattern_rest)
            if not rest.complete:
                branches.append(((head,), False))
                continue
            branches += self._then_next((head,), tool, given, style, depth)
        return branches

    def _conversation_strings(self, parameter: str) -> list[tuple[str, float]]:
        """Likely string values of ``parameter`` from the conversation (quoted text, names,
        ids, dates) not yet written in this output, with geometrically decreasing priors: those
        the conversation introduces with the parameter's words first ("the appointment ID is
        34567890" for ``appointment_id``), then the most recent."""
        found = [span for span in self._ranked_for(parameter, self._strings, self._strings_ranked,
                                                   {})
                 if span not in self._used_values]
        return [(span, self.priors.string_share * 0.5 ** i)
                for i, span in enumerate(found[:_MAX_STRINGS])]

    def _ranked_for(self, parameter: str, values: list[str], cache: dict[str, list[str]],
                    spellings: Mapping[str, str]) -> list[str]:
        """``values`` (the conversation's strings or numbers, spelled there as ``spellings``
        says where it differs) in ``_anchored_first`` order for ``parameter``. Mutates:
        ``cache`` (per parameter, for the request)."""
        ranked = cache.get(parameter)
        if ranked is None:
            ranked = cache[parameter] = _anchored_first(values, self.conversation, parameter,
                                                        spellings)
        return ranked

    def _conversation_numbers(self, parameter: str,
                              integers_only: bool) -> list[tuple[str, float]]:
        """Numbers of the conversation not yet written in this output, with geometrically
        decreasing priors: those its sentences introduce with ``parameter``'s words first
        ("a height of 5" for ``height``), then in order of appearance."""
        found = [n for n in self._ranked_for(parameter, self._numbers, self._numbers_ranked,
                                             self._number_spellings)
                 if n not in self._used_values and not (integers_only and "." in n)]
        return [(number, self.priors.number_share * 0.5 ** i)
                for i, number in enumerate(found[:_MAX_NUMBERS])]

    def _value_ends_now(self, tool: Tool, given: Sequence[str], typed: str, state: CallState,
                        style: JsonStyle, depth: int) -> list[Branch]:
        """The value being typed ends right here (copied to the end of what is typed)."""
        closer = '"' if state is CallState.VALUE_STRING else ""
        if typed.endswith("\\") and closer:
            return []  # inside an escape: a quote here would be part of the string
        head = Segment(typed + closer, VALUE, self.priors.value_ends_here)
        return self._then_next((head,), tool, given, style, depth)

    def _copied_numbers(self, tool: Tool, given: Sequence[str], typed: str, partial: str,
                        style: JsonStyle, depth: int) -> list[Branch]:
        """The number being typed is one of the conversation's that starts with its digits."""
        branches: list[Branch] = []
        for number, share in self._typed_numbers(partial):
            head = Segment(typed + number[len(partial):], VALUE, share)
            branches += self._then_next((head,), tool, given, style, depth)
        return branches

    def _copied_spans(self, tool: Tool, given: Sequence[str], typed: str, partial: str,
                      style: JsonStyle, depth: int) -> list[Branch]:
        """The string value is a span of the conversation that starts with what is typed."""
        branches: list[Branch] = []
        for span, share in self._typed_spans(partial):
            head = Segment(typed + _quoted_inner(span[len(partial):]) + '"', VALUE, share)
            branches += self._then_next((head,), tool, given, style, depth)
        return branches

    def _typed_numbers(self, partial: str) -> list[tuple[str, float]]:
        """The conversation's numbers that go on from the digits typed, sharing ``copied_span``."""
        numbers = [n for n in self._numbers
                   if len(n) > len(partial) and n.startswith(partial)][:_MAX_NUMBERS]
        return [(number, self.priors.copied_span / len(numbers)) for number in numbers]

    def _typed_spans(self, partial: str) -> list[tuple[str, float]]:
        """The conversation's spans that go on from the string typed, sharing ``copied_span``;
        for a snake_case string the conversation does not hold, its words as the conversation
        goes on from them, joined by underscores ("social security numbers" for
        ``social_se``)."""
        spans = _spans_starting_with(self.conversation, partial) if partial else []
        if not spans and "_" in partial.strip("_"):
            spans = [span.replace(" ", "_") for span in
                     _spans_starting_with(self.conversation, partial.replace("_", " "))]
        return [(span, self.priors.copied_span / len(spans)) for span in spans]

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
            branches += [((between, *rest), ends) for rest, ends in self._call_body(style, depth - 1)]
        else:
            branches.append(((between,), False))
        return branches


def _quoted_inner(text: str) -> str:
    """``text`` as it appears between JSON quotes (escaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _known_values(schema: Mapping[str, Any]) -> list[Any]:
    """Values the schema pins down: ``enum`` / ``const`` members, booleans, null."""
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return list(schema["enum"])
    kind = json_type(schema)
    if kind == "boolean":
        return [True, False]
    if kind == "null":
        return [None]
    return []


# A number as the call so far writes it (the conversation's are read by ``stated_numbers``).
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")
_MAX_NUMBERS = 4
_MAX_STRINGS = 4
_MAX_DATES = 4
_SENTENCE_ENDS = ".!?\n>:"
_WORD = re.compile(r"[a-z0-9]+")
_ANCHOR_WINDOW = 48  # characters before a span in which a parameter's words introduce it
_SENTENCE_BREAK = re.compile(r"[.!?](?:\s|$)|\n")
_TYPED_YEAR = re.compile(r"((?:19|20)\d\d)\b")
# Spans that tend to be argument values: quoted text, capitalised names, tokens with digits
# (ids, dates, times, emails).
_VALUE_LIKE = re.compile(
    r"\"([^\"\n]{1,60})\"|'([^'\n]{2,60})'"
    r"|(?P<name>(?:(?:Dr|Mr|Mrs|Ms|Prof)\.\s?)?[A-Z][\w'&-]*(?:\s+[A-Z][\w'&-]*)*)"
    r"|([\w.@:/+-]*\d[\w.@:/+-]*)"
)


def _latest_message_first(mentions: Sequence[DateMention], text: str) -> list[DateMention]:
    """``mentions`` of later lines (messages) first; within a line in order of appearance (the
    order in which "from 2pm to 4pm" fills a start and an end)."""
    return sorted(mentions, key=lambda m: (-text.count("\n", 0, m.position), m.position))


def _value_like_spans(conversation: str) -> list[str]:
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


def _anchored_first(spans: Sequence[str], conversation: str, parameter: str,
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


_SPAN_STOPS = '"\n,;:!?()[]{}<>'
_MAX_SPANS = 3


def _spans_starting_with(conversation: str, partial: str, longest: int = 80) -> list[str]:
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
