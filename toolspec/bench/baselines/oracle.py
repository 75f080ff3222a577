"""The oracle: drafts the known true continuation — the physical upper bound for a benchmark."""

from __future__ import annotations

from collections.abc import Sequence

from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import DraftRequest


class OracleDrafter:
    """Proposes the next ``budget`` tokens of ``continuation`` while the output follows it.

    ``continuation`` is what the target model produces on its own (e.g. the AR output), so every
    draft is accepted and the step count is the minimum the budget allows. Once the output
    leaves the continuation the oracle falls silent.
    """

    name = "oracle"

    def __init__(self, continuation: Sequence[int]) -> None:
        self.continuation = tuple(continuation)
        self._emitted = 0
        self._on_track = True

    def start(self, request: DraftRequest) -> None:
        self._emitted = 0
        self._on_track = True

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if not self._on_track:
            return DraftTree()
        ahead = self.continuation[self._emitted : self._emitted + budget]
        return DraftTree.from_sequences([(ahead, self.name)])

    def observe(self, emitted: Sequence[int]) -> None:
        expected = self.continuation[self._emitted : self._emitted + len(emitted)]
        self._on_track = self._on_track and tuple(emitted) == expected
        self._emitted += len(emitted)

    def stop(self) -> None:
        self._emitted = 0
