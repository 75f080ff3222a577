"""Schema-aware drafting: candidates from the request's tool schemas (the ``CallGrammar``)."""

from __future__ import annotations

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallScanner
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.drafting.call_grammar import CallGrammar
from toolspec.drafting.prompt_literals import nested_literals
from toolspec.drafting.style import StyleMemory
from toolspec.drafting.text_drafts import TextDraft
from toolspec.drafting.token_continuation import TokenContinuer
from toolspec.drafting.tool_calls import DraftingView, ToolCallDrafter


class GrammarSource:
    """Fixed schema text, tool and parameter names, known values, call endings.

    Mutates: builds a ``CallGrammar`` per request (whose branch cache lives for the request).
    """

    name = "schema"

    def __init__(self, chained_choices: int = 2) -> None:
        self.chained_choices = chained_choices
        self._grammar: CallGrammar | None = None

    def start(self, request: DraftRequest, conversation: str, prompt_text: str) -> None:
        self._grammar = None
        if request.tools is not None and request.call_format is not None:
            self._grammar = CallGrammar(request.tools, request.call_format,
                                        chained_choices=self.chained_choices,
                                        conversation=conversation,
                                        literals=nested_literals(prompt_text))

    def candidates(self, view: DraftingView) -> list[TextDraft]:
        if self._grammar is None:
            return []
        return self._grammar.continuations(view.scanner, view.styles, view.opening_options,
                                           view.closings, view.years)

    def finish(self, request: DraftRequest, scanner: CallScanner) -> None:
        self._grammar = None


class SchemaDrafter(ToolCallDrafter):
    """Drafts tool calls from the request's tool schemas, over a generic ``fallback`` drafter."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        fallback: Drafter | None = None,
        eos_token_id: int | None = None,
        max_candidates: int = 48,
        chained_choices: int = 2,
        memory: StyleMemory | None = None,
        continuer: TokenContinuer | None = None,
    ) -> None:
        super().__init__(tokenizer, [GrammarSource(chained_choices)], fallback, eos_token_id,
                         max_candidates, name="toolspec-schema", memory=memory,
                         continuer=continuer)
