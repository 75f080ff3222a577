"""Suffix automaton: the smallest automaton accepting every substring of a token sequence.

Built online (Blumer et al.), one token at a time in amortised O(1), so it can follow a
generation as it grows. A stream of tokens is matched against it with ``step``: the match is the
longest suffix of the stream that occurs in the automaton's text, and ``continuation`` reads what
followed the first occurrence of that suffix. Several documents are kept apart by a unique
(negative) separator after each, so no match spans two documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_ROOT = 0


@dataclass(frozen=True)
class Match:
    """The longest suffix of a stream found in the text: its ``length`` and automaton ``state``."""

    state: int = _ROOT
    length: int = 0


class SuffixAutomaton:
    """Suffix automaton of ``tokens`` (non-negative ids). Mutates: ``extend`` and
    ``add_document`` grow it; matches taken earlier stay valid (``step`` re-anchors them)."""

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._length: list[int] = [0]
        # Index just past the first occurrence of the state's strings (their first end position).
        self._first_end: list[int] = [0]
        self._last = _ROOT
        self._documents = 0
        for token in tokens:
            self.extend(token)

    def __len__(self) -> int:
        """Number of states, the root included (at most 2n - 1 for n >= 2 tokens)."""
        return len(self._next)

    def _new_state(self, length: int, link: int, first_end: int, next_: dict[int, int]) -> int:
        self._next.append(next_)
        self._link.append(link)
        self._length.append(length)
        self._first_end.append(first_end)
        return len(self._next) - 1

    def extend(self, token: int) -> None:
        """Append ``token`` to the text."""
        self.tokens.append(token)
        current = self._new_state(self._length[self._last] + 1, _ROOT, len(self.tokens), {})
        state = self._last
        while state != -1 and token not in self._next[state]:
            self._next[state][token] = current
            state = self._link[state]
        if state != -1:
            target = self._next[state][token]
            if self._length[state] + 1 == self._length[target]:
                self._link[current] = target
            else:
                clone = self._new_state(self._length[state] + 1, self._link[target],
                                        self._first_end[target], dict(self._next[target]))
                while state != -1 and self._next[state].get(token) == target:
                    self._next[state][token] = clone
                    state = self._link[state]
                self._link[target] = self._link[current] = clone
        self._last = current

    def add_document(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` as a document of its own, closed by a separator nothing matches."""
        for token in tokens:
            if token < 0:
                raise ValueError(f"token ids must be non-negative, got {token}")
            self.extend(token)
        self._documents += 1
        self.extend(-self._documents)

    def _anchor(self, match: Match) -> Match:
        # A state split by a later ``extend`` keeps only the longer strings; shorter matches
        # belong to the clone, found up the suffix links.
        state = match.state
        while state != _ROOT and self._length[self._link[state]] >= match.length:
            state = self._link[state]
        return Match(state, match.length)

    def step(self, match: Match, token: int) -> Match:
        """The match of the stream extended by ``token``: the longest suffix still in the text."""
        match = self._anchor(match)
        state, length = match.state, match.length
        while state != _ROOT and token not in self._next[state]:
            state = self._link[state]
            length = self._length[state]
        if token in self._next[state]:
            return Match(self._next[state][token], length + 1)
        return Match()

    def match(self, tokens: Iterable[int], match: Match = Match()) -> Match:
        """``match`` stepped through every token of ``tokens``."""
        for token in tokens:
            match = self.step(match, token)
        return match

    def first_end(self, match: Match) -> int:
        """Index in ``tokens`` just past the first occurrence of the matched suffix."""
        return self._first_end[self._anchor(match).state]

    def continuation(self, match: Match, length: int) -> list[int]:
        """Up to ``length`` tokens that followed the matched suffix's first occurrence, stopping
        at the end of its document; empty without a match."""
        if match.length == 0:
            return []
        start = self.first_end(match)
        following = self.tokens[start : start + length]
        for index, token in enumerate(following):
            if token < 0:
                return following[:index]
        return following
