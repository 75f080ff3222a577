"""Prompt lookup (PLD): continue the context the way an earlier occurrence of its suffix went.

Tool calls copy a lot from the prompt (names, ids, dates), so the longest n-gram at the end of the
context that also occurred earlier (in the prompt or the output so far) is a good predictor of the
next tokens: draft what followed it. Several earlier occurrences give several branches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import DraftRequest


class PromptLookupDrafter:
    """N-gram match over prompt + output, drafting up to ``max_branches`` distinct continuations.

    Matches of the longest n-gram (``max_ngram`` down to ``min_ngram``) come first, the most
    recent occurrence first; each branch is at most ``continuation_length`` tokens.
    Mutates: an n-gram index of the request's tokens, extended by ``observe``.
    """

    name = "pld"

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        continuation_length: int = 10,
        max_branches: int = 4,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.continuation_length = continuation_length
        self.max_branches = max_branches
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = defaultdict(list)

    def start(self, request: DraftRequest) -> None:
        self._tokens = []
        self._ends = defaultdict(list)
        self._extend(request.prompt_ids)

    def _extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._tokens.append(token)
            end = len(self._tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._ends[tuple(self._tokens[end - n : end])].append(end)

    def continuations(self) -> list[list[int]]:
        """Distinct continuations of the current suffix, best first."""
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        length = len(self._tokens)
        for n in range(min(self.max_ngram, length), self.min_ngram - 1, -1):
            for end in reversed(self._ends.get(tuple(self._tokens[length - n :]), ())):
                continuation = self._tokens[end : end + self.continuation_length]
                if end == length or tuple(continuation) in seen:
                    continue
                seen.add(tuple(continuation))
                found.append(continuation)
                if len(found) == self.max_branches:
                    return found
        return found

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return DraftTree.from_sequences(((c, self.name) for c in self.continuations()), budget)

    def observe(self, emitted: Sequence[int]) -> None:
        self._extend(emitted)

    def stop(self) -> None:
        self._tokens = []
        self._ends = defaultdict(list)
