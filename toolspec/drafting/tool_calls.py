"""The tool-call drafter: candidate continuations from several sources, tokenized in context.

Per step it reads the output so far through the request's one parse of it (its
``RequestOutput``: the format's incremental scanner), asks each
``CandidateSource`` (the schema grammar, the call library) for candidate continuations as text,
turns each into the token ids the model's tokenizer would produce in context
(``TokenContinuer``), and merges them into one weighted trie. A generic drafter (``suffix`` in the
shipped methods) adds its own branches for what the sources cannot predict — free-text values and
prose — at the step's root and, when it can draft after any context, below the sources' likeliest
leaf.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallFormat, CallScanner, JsonStyle
from toolspec.calls.output import RequestOutput
from toolspec.core.draft_tree import DraftTree, WeightedDraft
from toolspec.core.drafter import Drafter, DraftRequest, context_drafter
from toolspec.drafting.style import StyleMemory
from toolspec.drafting.text_drafts import CLOSE, TextDraft, scaled
from toolspec.drafting.token_continuation import TokenContinuer, TokenizedContinuation


@dataclass(frozen=True)
class DraftingView:
    """What the sources see at one step."""

    scanner: CallScanner
    call_format: CallFormat
    styles: Sequence[tuple[JsonStyle, float]]  # JSON spacings to draft in, with probabilities
    closings: Sequence[tuple[str, float]]  # what may follow the last call
    opening_options: Sequence[tuple[str, float]]  # what may precede the first call
    years: Sequence[int] = ()  # the years the model writes dates in, the most used first


class CandidateSource(Protocol):
    """Proposes text continuations written from ``view.scanner.anchor``."""

    name: str

    def start(self, request: DraftRequest, conversation: str, prompt_text: str) -> None:
        """Begin a request: ``conversation`` is the text argument values come from,
        ``prompt_text`` the whole prompt (tool descriptions included). Mutates: the source's
        per-request state."""

    def candidates(self, view: DraftingView) -> list[TextDraft]:
        """Candidates with probabilities summing to at most 1."""

    def finish(self, request: DraftRequest, scanner: CallScanner) -> None:
        """The request's output is complete. May mutate shared state (e.g. a call library)."""


class ToolCallDrafter:
    """Drafts tool calls from candidate ``sources`` over a generic ``fallback`` drafter.

    When several sources propose, their candidates are mixed with equal weight. The
    ``eos_token_id`` is drafted after a call block that ends the output. A fallback that can
    draft after any context (``ContextDrafter``) also goes on below the ``extended_leaves``
    likeliest leaves of the sources' tree. ``memory`` (the model's habits) and ``continuer``
    (a tokenization cache) may be shared with other drafters — one drafter per request of a
    tenant, all learning into the tenant's memory. Mutates: per-request state and the
    cross-request ``StyleMemory``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sources: Sequence[CandidateSource],
        fallback: Drafter | None = None,
        eos_token_id: int | None = None,
        max_candidates: int = 48,
        name: str = "toolspec",
        extended_leaves: int = 1,
        memory: StyleMemory | None = None,
        continuer: TokenContinuer | None = None,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.sources = tuple(sources)
        self.continuer = continuer or TokenContinuer(tokenizer)
        self.fallback = fallback
        self.eos_token_id = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
        self.max_candidates = max_candidates
        self.extended_leaves = extended_leaves
        self._extender = context_drafter(fallback)  # checked once: propose runs every step
        self.memory = memory if memory is not None else StyleMemory()
        self._request: DraftRequest | None = None
        self._output: RequestOutput | None = None
        self._owns_output = False

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self, request: DraftRequest) -> None:
        self._request = request
        self._output, self._owns_output = None, False
        if request.tools is not None and request.call_format is not None:
            # The request's own reading of its output; a drafter driven alone keeps one.
            self._output, self._owns_output = request.output, request.output is None
            if self._owns_output:
                self._output = RequestOutput(self.tokenizer, request.call_format)
            prompt_text = self.tokenizer.decode(request.prompt_ids, skip_special_tokens=True)
            conversation = request.conversation or prompt_text
            for source in self.sources:
                source.start(request, conversation, prompt_text)
        if self.fallback is not None:
            self.fallback.start(request)

    def observe(self, emitted: Sequence[int]) -> None:
        if self._owns_output:
            for token in emitted:
                self._output.append(token)
        if self.fallback is not None:
            self.fallback.observe(emitted)

    def stop(self) -> None:
        if self._output is not None and self._request is not None:
            self.memory.learn(self._request.call_format, self._output.parse.scanner,
                              self._end_text(self._output.tokens))
            for source in self.sources:
                source.finish(self._request, self._output.parse.scanner)
        if self.fallback is not None:
            self.fallback.stop()
        self._output, self._owns_output = None, False
        self._request = None

    def _end_text(self, tokens: Sequence[int]) -> str:
        """The text of the special token that ended the output ("" if none did; the output's
        text leaves special tokens out)."""
        if not tokens or tokens[-1] not in getattr(self.tokenizer, "all_special_ids", ()):
            return ""
        return self.tokenizer.decode(tokens[-1:], skip_special_tokens=False)

    @property
    def scanner(self) -> CallScanner | None:
        """The current request's scanner (read-only use: statistics, tests)."""
        return self._output.parse.scanner if self._output is not None else None

    # ---- drafting -------------------------------------------------------------------------

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        """Up to ``budget`` nodes from the sources, up to ``budget`` from the fallback at the
        root and as many below each extended leaf, in one trie (no path deeper than
        ``budget``). The engine's draft budget picks what is verified by calibrated acceptance,
        so sources offering many unlikely candidates (every way to end a string value, say)
        cannot crowd out the fallback's likely ones (the value's rest)."""
        drafts = self.text_drafts()
        tokenized = self.continuer.continue_many(context, [draft.text for draft in drafts])
        weighted = [w for w in map(self._weighted, drafts, tokenized) if w]
        tree = self._extend_leaves(context, DraftTree.from_weighted(weighted, budget), budget)
        if self.fallback is not None:
            tree = tree.merge(self.fallback.propose(context, budget), len(tree) + budget)
        return tree

    def _extend_leaves(self, context: Sequence[int], tree: DraftTree, budget: int) -> DraftTree:
        """``tree`` with the fallback's drafts below its likeliest leaves that do not end the
        output, each as if the leaf's path had been emitted: where the sources stop (the
        end of what a value's known start or a stored call says) the model sometimes goes on
        as the fallback predicts (a phrase of the prompt, an earlier output's rest)."""
        extender = self._extender
        if extender is None or self.extended_leaves <= 0 or not tree:
            return tree
        reaches, depths = tree.reaches, tree.depths
        leaves = [leaf for leaf in tree.leaves()
                  if tree.tokens[leaf] != self.eos_token_id and depths[leaf] < budget]
        leaves.sort(key=lambda leaf: -reaches[leaf])
        for leaf in leaves[: self.extended_leaves]:
            path = [tree.tokens[node] for node in tree.path_to(leaf)]
            room = budget - depths[leaf]
            tree = tree.merge(extender.propose_after([*context, *path], room),
                              len(tree) + room, under=leaf)
        return tree

    def text_drafts(self) -> list[TextDraft]:
        """Every source's candidates for the current position, minus what is already typed."""
        if self._output is None:
            return []
        scanner, call_format = self._output.parse.scanner, self._request.call_format
        opening = scanner.text[: scanner.first_call_start] \
            if scanner.first_call_start is not None else scanner.text
        view = DraftingView(
            scanner=scanner,
            call_format=call_format,
            styles=self.memory.style_options(scanner.text),
            closings=self.memory.closing_options(call_format, opening),
            opening_options=self.memory.opening_options(call_format),
            years=self.memory.year_options(),
        )
        typed = scanner.text[scanner.anchor:]
        proposals = [source.candidates(view) for source in self.sources]
        share = 1.0 / max(1, sum(1 for p in proposals if p))
        drafts = []
        for candidates in proposals:
            for draft in candidates:
                remainder = draft.after(typed)
                if remainder is not None and (remainder.text or remainder.ends_output):
                    drafts.append(TextDraft(scaled(remainder.segments, share),
                                            remainder.ends_output))
        drafts.sort(key=lambda d: -d.probability)
        return drafts[: self.max_candidates]

    def _weighted(self, draft: TextDraft, tokenized: TokenizedContinuation) -> WeightedDraft | None:
        """``draft``'s token ids (``tokenized``), each with its source and reach probability."""
        boundaries: list[tuple[int, float, str, int]] = []
        offset, reach, chain = 0, 1.0, hash(())
        for segment in draft.segments:
            offset += len(segment.text)
            reach *= segment.prior
            chain = hash((chain, segment))  # drafts with the same segments so far: one event
            boundaries.append((offset, reach, segment.source, chain))
        ids, sources, reaches, choices = [], [], [], []
        index = 0
        for token, end in zip(tokenized.ids, tokenized.ends):
            while index < len(boundaries) - 1 and boundaries[index][0] < end:
                index += 1
            _, token_reach, source, token_chain = boundaries[index]
            ids.append(token)
            reaches.append(token_reach)
            sources.append(source)
            choices.append(token_chain)
        if draft.ends_output and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
            reaches.append(reach)
            sources.append(CLOSE)
            choices.append(hash((chain, CLOSE)))
        if not ids:
            return None
        return WeightedDraft(tuple(ids), tuple(sources), tuple(reaches), tuple(choices))
