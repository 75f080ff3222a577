"""SAM-Decoding (Hu et al., 2024): longest-suffix match with suffix automata, drafting what
followed.

Two automata are matched against the request's tokens as they arrive: a dynamic one over the
request itself (prompt + output, grown token by token) and a static one over a corpus of earlier
outputs. Whichever matches the longer suffix (the static match discounted by ``len_bias``)
drafts the ``n_predicts`` tokens that followed its first occurrence, provided the match is at
least ``len_threshold`` tokens long; shorter matches fall back to Token Recycling, the paper's
model-free auxiliary drafter (SAM-Decoding[T]).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from toolspec.bench.baselines.recycling import TokenRecyclingDrafter
from toolspec.bench.baselines.suffix_automaton import Match, SuffixAutomaton
from toolspec.core.draft_tree import DraftTree, WeightedDraft
from toolspec.core.drafter import DraftRequest


class SamDecodingDrafter:
    """Suffix-automaton drafts over the request and a growing corpus, Token Recycling below.

    Parameters (defaults of the paper's code): ``n_predicts`` = 10 tokens per draft;
    ``len_threshold`` = 4, the shortest match worth drafting; ``len_bias`` = 4, subtracted from
    the static match before the comparison (the request's own text is the better predictor).
    ``recycling_fallback`` drafts with Token Recycling below the threshold (else nothing).
    ``corpus`` seeds the static automaton (e.g. a training split's outputs); with ``learn`` every
    finished request's output is added to it at ``stop`` — never during the request, so an
    output can only help later requests. A draft is a chain; each node's prior is m / (m + 1)
    for a match of m tokens (our choice: the paper drafts without priors).
    Mutates: the static automaton (across requests), the dynamic one and both matches (per
    request), and the fallback.
    """

    name = "samd"

    def __init__(
        self,
        n_predicts: int = 10,
        len_threshold: int = 4,
        len_bias: int = 4,
        recycling_fallback: bool = True,
        corpus: Iterable[Sequence[int]] = (),
        learn: bool = True,
    ) -> None:
        if n_predicts < 1 or len_threshold < 1:
            raise ValueError(f"n_predicts and len_threshold must be >= 1, got {n_predicts}, "
                             f"{len_threshold}")
        self.n_predicts = n_predicts
        self.len_threshold = len_threshold
        self.len_bias = len_bias
        self.fallback = TokenRecyclingDrafter() if recycling_fallback else None
        self.learn = learn
        self.static = SuffixAutomaton()
        for document in corpus:
            self.static.add_document(document)
        self._dynamic = SuffixAutomaton()
        self._dynamic_match = Match()
        self._static_match = Match()
        self._output: list[int] = []

    @property
    def logits_top_k(self) -> int:
        return self.fallback.logits_top_k if self.fallback is not None else 0

    def start(self, request: DraftRequest) -> None:
        self._dynamic = SuffixAutomaton()
        self._dynamic_match = Match()
        self._static_match = Match()
        self._output = []
        self._follow(request.prompt_ids)
        if self.fallback is not None:
            self.fallback.start(request)

    def _follow(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            # Match before the token joins the dynamic text, so the match is an earlier
            # occurrence and has a continuation.
            self._dynamic_match = self._dynamic.step(self._dynamic_match, token)
            self._dynamic.extend(token)
            self._static_match = self.static.step(self._static_match, token)

    def draft_chain(self, length: int) -> tuple[list[int], int]:
        """The SAM draft of at most ``length`` tokens and its match length (([], 0) if none)."""
        dynamic, static = self._dynamic_match.length, self._static_match.length - self.len_bias
        if dynamic >= static:
            automaton, match, matched = self._dynamic, self._dynamic_match, dynamic
        else:
            automaton, match, matched = self.static, self._static_match, static
        if matched < self.len_threshold:
            return [], 0
        return automaton.continuation(match, length), matched

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        chain, matched = self.draft_chain(min(self.n_predicts, budget))
        if chain:
            prior = matched / (matched + 1)
            reach = tuple(prior ** (depth + 1) for depth in range(len(chain)))
            return DraftTree.from_weighted(
                [WeightedDraft(tuple(chain), (self.name,) * len(chain), reach)], budget)
        if self.fallback is not None:
            return self.fallback.propose(context, budget)
        return DraftTree()

    def observe_logits(self, tokens: Sequence[int], top_k_ids: Sequence[Sequence[int]]) -> None:
        if self.fallback is not None:
            self.fallback.observe_logits(tokens, top_k_ids)

    def observe(self, emitted: Sequence[int]) -> None:
        self._follow(emitted)
        self._output.extend(emitted)
        if self.fallback is not None:
            self.fallback.observe(emitted)

    def stop(self) -> None:
        if self.learn and self._output:
            self.static.add_document(self._output)
        self._output = []
        self._dynamic = SuffixAutomaton()
        if self.fallback is not None:
            self.fallback.stop()
