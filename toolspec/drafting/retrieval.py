"""Retrieval-augmented drafting: past calls from the call library, offered whole.

Tools are called again and again, often with the same or similar arguments. Before the model has
started a call, the tenant's most used calls are offered as whole-call drafts (ranked by use and
recency, boosted when their argument values occur in the conversation); once a call has begun,
stored calls that start with what is typed are offered as continuations — parameter values
included, which the schema alone cannot predict. Every finished call the model produced goes
back into the library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallScanner, CallState
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.drafting.schema import GrammarSource
from toolspec.drafting.style import StyleMemory
from toolspec.drafting.text_drafts import CLOSE, Segment, TextDraft
from toolspec.drafting.token_continuation import TokenContinuer
from toolspec.drafting.tool_calls import DraftingView, ToolCallDrafter
from toolspec.library import CallLibrary, LibraryError, LibraryMatch

RETRIEVAL = "retrieval"
# The last call usually ends the output; another call follows it otherwise.
_END_SHARE = 0.75
# Up to this many offered tools, whole calls are looked up tool by tool (one shard each), so a
# library full of other tools' calls cannot crowd the request's own tools out of the top k.
_PER_TOOL_LOOKUPS = 16


class LibrarySource:
    """Candidates from a ``CallLibrary`` for the request's tenant; ``k`` matches per step.

    Reads the library only: finished calls reach it through ``CallLibrary.remember``, called
    by whoever runs the requests (a replica's library cache, the benchmark, the simulator).
    """

    name = RETRIEVAL

    def __init__(self, library: CallLibrary, k: int = 6) -> None:
        self.library = library
        self.k = k
        self._tenant = "default"
        self._conversation = ""
        self._tools: frozenset[str] = frozenset()

    def start(self, request: DraftRequest, conversation: str, prompt_text: str) -> None:
        self._tenant = request.tenant
        self._conversation = conversation
        self._tools = frozenset(request.tools.names) if request.tools is not None else frozenset()

    def candidates(self, view: DraftingView) -> list[TextDraft]:
        scanner = view.scanner
        typed = scanner.text[scanner.anchor:]
        call_start = scanner.current_call_start
        if call_start is not None:
            matches = self._lookup(view, scanner.text[call_start:], scanner.tool_name)
            return self._drafts(view, matches, lambda match: typed + match.continuation)
        if scanner.state is not CallState.TEXT or scanner.calls:
            return []  # between calls the grammar drafts the separator; no whole call here
        drafts = []
        matches = self._whole_calls(view)
        for opening, share in view.opening_options:
            def whole(match: LibraryMatch, opening: str = opening) -> str:
                return opening + "{" + match.continuation

            for draft in self._drafts(view, matches, whole, share):
                if draft.text.startswith(typed):
                    drafts.append(draft)
        return drafts

    def _whole_calls(self, view: DraftingView) -> list[LibraryMatch]:
        """The best stored calls of the offered tools, before any of a call is typed."""
        if len(self._tools) > _PER_TOOL_LOOKUPS:
            return self._lookup(view, "{", None)
        found = [match for tool in sorted(self._tools) for match in self._lookup(view, "{", tool)]
        return sorted(found, key=lambda match: -match.weight)[: self.k]

    def _lookup(self, view: DraftingView, typed_call: str, tool: str | None) -> list[LibraryMatch]:
        try:
            matches = self.library.lookup_text(
                self._tenant, typed_call, view.call_format.arguments_key, view.styles[0][0],
                tool, 2 * self.k)
        except LibraryError:
            return []  # e.g. a spacing style the library does not index: no retrieval
        return [m for m in matches if m.record.tool in self._tools][: self.k]

    def _drafts(self, view: DraftingView, matches: Sequence[LibraryMatch],
                text_of: Callable[[LibraryMatch], str], share: float = 1.0) -> list[TextDraft]:
        """Each match as text from the anchor, then the call's end, weighted by use and by how
        many of its argument values the conversation mentions."""
        if not matches:
            return []
        weights = [match.weight * (1 + self._overlap(match)) for match in matches]
        total = sum(weights) or 1.0
        drafts = []
        for match, weight in zip(matches, weights):
            body = Segment(text_of(match), RETRIEVAL, share * weight / total)
            for closing, prior in view.closings:
                drafts.append(TextDraft((body, Segment(closing, CLOSE, prior * _END_SHARE)), True))
        return drafts

    def _overlap(self, match: LibraryMatch) -> int:
        values = [v for v in match.record.arguments.values()
                  if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
        return sum(1 for value in values if str(value) and str(value) in self._conversation)

    def finish(self, request: DraftRequest, scanner: CallScanner) -> None:
        self._conversation = ""
        self._tools = frozenset()


class RetrievalDrafter(ToolCallDrafter):
    """Whole-call drafts from the call library only (plus the generic ``fallback``).

    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, library: CallLibrary,
                 fallback: Drafter | None = None,
                 memory: StyleMemory | None = None,
                 continuer: TokenContinuer | None = None) -> None:
        super().__init__(tokenizer, [LibrarySource(library)], fallback,
                         name="toolspec-retrieval", memory=memory, continuer=continuer)


class ToolSpecDrafter(ToolCallDrafter):
    """The full method: schema grammar and call library, mixed, over the generic ``fallback``.

    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, library: CallLibrary,
                 fallback: Drafter | None = None,
                 memory: StyleMemory | None = None,
                 continuer: TokenContinuer | None = None) -> None:
        super().__init__(tokenizer, [GrammarSource(), LibrarySource(library)],
                         fallback, name="toolspec", memory=memory, continuer=continuer)
