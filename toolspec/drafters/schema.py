"""The schema-aware drafter: tool-call grammar drafts, tokenized in context, over a fallback.

Per step it reads the output so far through the format's incremental scanner, asks the
``CallGrammar`` for candidate continuations (fixed schema text, tool names, parameter names, enum
and boolean values, spans copied from the conversation, call endings), turns each into the token
ids the model's tokenizer would produce in context (``TokenContinuer``), and merges them into one
weighted trie. A generic drafter (prompt lookup by default) adds its own branches for what the
schema cannot predict — free-text parameter values and prose.

It learns the model's habits across requests: its JSON spacing (``{"a": 1}`` vs ``{"a":1}``) and
the text it writes before the first call and after the last one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.draft_tree import DraftTree, WeightedDraft
from toolspec.drafters.base import DraftRequest, Drafter
from toolspec.drafters.call_grammar import CLOSE, CallGrammar, TextDraft
from toolspec.formats import COMPACT_STYLE, DEFAULT_STYLE, CallFormat, CallScanner, JsonStyle
from toolspec.token_continuation import TokenContinuer

_COLON = re.compile(r'"name"(\s*):(\s*)"')
_COMMA = re.compile(r'"(\s*),(\s*)"')
_MAX_WRAPPER = 40


class StyleMemory:
    """What the model has been seen to write, across requests. Mutates: its counters."""

    def __init__(self) -> None:
        self.styles: Counter[JsonStyle] = Counter()
        self.openings: dict[str, Counter[str]] = {}
        # Per format and opening: what followed the last call. A model that opened with the
        # block's fence closes it; one that started with a bare object does not.
        self.closings: dict[tuple[str, str], Counter[str]] = {}

    def style_of(self, text: str) -> JsonStyle | None:
        colon, comma = _COLON.search(text), _COMMA.search(text)
        if colon is None:
            return None
        colon_text = colon.group(1) + ":" + colon.group(2)
        comma_text = (comma.group(1) + "," + comma.group(2)) if comma else (
            DEFAULT_STYLE.comma if colon_text == DEFAULT_STYLE.colon else COMPACT_STYLE.comma)
        return JsonStyle(colon_text, comma_text)

    def style_options(self, current_text: str) -> list[tuple[JsonStyle, float]]:
        """The style seen in this output, else the styles seen before, else both common ones."""
        seen = self.style_of(current_text)
        if seen is not None:
            return [(seen, 1.0)]
        if self.styles:
            total = sum(self.styles.values())
            return [(style, count / total) for style, count in self.styles.most_common(2)]
        return [(DEFAULT_STYLE, 0.7), (COMPACT_STYLE, 0.3)]

    @staticmethod
    def _options(counter: Counter[str] | None, default: str) -> list[tuple[str, float]]:
        if not counter:
            return [(default, 1.0)]
        total = sum(counter.values())
        return [(text, count / total) for text, count in counter.most_common(3)]

    def opening_options(self, call_format: CallFormat) -> list[tuple[str, float]]:
        return self._options(self.openings.get(call_format.name),
                             call_format.block_open + call_format.call_open)

    def closing_options(self, call_format: CallFormat, opening: str) -> list[tuple[str, float]]:
        """What follows the last call of an output that began with ``opening``."""
        fenced = bool(call_format.block_open.strip()) and call_format.block_open.strip() in opening
        default = call_format.call_close + (call_format.block_close if fenced else "")
        if not call_format.block_open.strip():
            default = call_format.call_close + call_format.block_close
        return self._options(self.closings.get((call_format.name, opening)), default)

    def learn(self, call_format: CallFormat, scanner: CallScanner) -> None:
        """Record the spacing, opening and closing of a finished output that held calls."""
        if not scanner.calls:
            return
        style = self.style_of(scanner.text)
        if style is not None:
            self.styles[style] += 1
        first, last = scanner.calls[0], scanner.calls[-1]
        # Short wrappers only: a long preamble is prose, not a habit worth drafting.
        opening = scanner.text[: first.start]
        if len(opening) <= _MAX_WRAPPER:
            self.openings.setdefault(call_format.name, Counter())[opening] += 1
        closing = scanner.text[last.end:]
        if len(opening) <= _MAX_WRAPPER and len(closing) <= _MAX_WRAPPER:
            self.closings.setdefault((call_format.name, opening), Counter())[closing] += 1


class SchemaDrafter:
    """Drafts tool calls from the request's tool schemas, over a generic ``fallback`` drafter.

    ``eos_token_id`` is drafted after a call block that ends the output. Mutates: per-request
    scan state, and the cross-request ``StyleMemory``.
    """

    name = "toolspec-schema"

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        fallback: Drafter | None = None,
        eos_token_id: int | None = None,
        max_candidates: int = 48,
        chained_choices: int = 2,
    ) -> None:
        self.tokenizer = tokenizer
        self.continuer = TokenContinuer(tokenizer)
        self.fallback = fallback
        self.eos_token_id = eos_token_id if eos_token_id is not None else tokenizer.eos_token_id
        self.max_candidates = max_candidates
        self.chained_choices = chained_choices
        self.memory = StyleMemory()
        self._format: CallFormat | None = None
        self._scanner: CallScanner | None = None
        self._grammar: CallGrammar | None = None
        self._generated: list[int] = []

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self, request: DraftRequest) -> None:
        self._format = request.call_format
        self._scanner = self._format.scanner() if self._format is not None else None
        self._generated = []
        self._grammar = None
        if request.tools is not None and self._format is not None:
            conversation = request.conversation or self.tokenizer.decode(
                request.prompt_ids, skip_special_tokens=True)
            self._grammar = CallGrammar(
                request.tools,
                self._format,
                openings=self.memory.opening_options(self._format),
                chained_choices=self.chained_choices,
                conversation=conversation,
            )
        if self.fallback is not None:
            self.fallback.start(request)

    def observe(self, emitted: Sequence[int]) -> None:
        self._generated.extend(emitted)
        if self._scanner is not None:
            self._advance_scanner()
        if self.fallback is not None:
            self.fallback.observe(emitted)

    def stop(self) -> None:
        if self._format is not None and self._scanner is not None:
            self.memory.learn(self._format, self._scanner)
        if self.fallback is not None:
            self.fallback.stop()
        self._scanner = None
        self._grammar = None
        self._generated = []

    # ---- drafting -------------------------------------------------------------------------

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        tree = DraftTree.from_weighted(self._schema_drafts(context), budget)
        if self.fallback is not None and len(tree) < budget:
            tree = tree.merge(self.fallback.propose(context, budget), budget)
        return tree

    def text_drafts(self) -> list[TextDraft]:
        """The grammar's candidates for the current position, minus what is already typed."""
        scanner, grammar = self._scanner, self._grammar
        if scanner is None or grammar is None or self._format is None:
            return []
        typed = scanner.text[scanner.anchor:]
        drafts = []
        opening = scanner.text[: scanner.first_call_start] \
            if scanner.first_call_start is not None else scanner.text
        closings = self.memory.closing_options(self._format, opening)
        styles = self.memory.style_options(scanner.text)
        for draft in grammar.continuations(scanner, styles, closings):
            remainder = draft.after(typed)
            if remainder is not None and (remainder.text or remainder.ends_output):
                drafts.append(remainder)
        drafts.sort(key=lambda d: -d.probability)
        return drafts[: self.max_candidates]

    def _schema_drafts(self, context: Sequence[int]) -> list[WeightedDraft]:
        weighted = []
        for draft in self.text_drafts():
            tokens = self._tokens(draft, context)
            if tokens is not None:
                weighted.append(tokens)
        return weighted

    def _tokens(self, draft: TextDraft, context: Sequence[int]) -> WeightedDraft | None:
        """Token ids of ``draft`` in context, each with its source and reach probability."""
        tokenized = self.continuer.continue_ids(context, draft.text)
        boundaries: list[tuple[int, float, str]] = []
        offset, reach = 0, 1.0
        for segment in draft.segments:
            offset += len(segment.text)
            reach *= segment.prior
            boundaries.append((offset, reach, segment.source))
        ids, sources, reaches = [], [], []
        index = 0
        for token, end in zip(tokenized.ids, tokenized.ends):
            while index < len(boundaries) - 1 and boundaries[index][0] < end:
                index += 1
            ids.append(token)
            reaches.append(boundaries[index][1])
            sources.append(boundaries[index][2])
        if draft.ends_output and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
            reaches.append(reach)
            sources.append(CLOSE)
        if not ids:
            return None
        return WeightedDraft(tuple(ids), tuple(sources), tuple(reaches))

    def _advance_scanner(self) -> None:
        text = self.tokenizer.decode(self._generated, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
        # A token can end inside a multi-byte character; wait for the rest of it.
        text = text.rstrip("\ufffd")
        if self._scanner is None or self._format is None:
            return
        if not text.startswith(self._scanner.text):
            self._scanner = self._format.scanner()
        self._scanner.feed(text[len(self._scanner.text):])

    @property
    def scanner(self) -> CallScanner | None:
        """The current request's scanner (read-only use: simulator statistics)."""
        return self._scanner
