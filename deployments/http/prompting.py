"""A request's prompt at the ingress: rendered once, counted against the model's context.

The ingress renders the chat template with the served model's tokenizer (no weights: a
tokenizer loads in a second), refuses a prompt that leaves no room for the answer before any
model work, and hands the token ids to the replica, which then need not render them again.
"""

from __future__ import annotations

from dataclasses import replace

from jinja2 import TemplateError

from deployments.http.admission import AdmissionError, explicit_max_tokens
from deployments.http.schemas import ChatCompletionRequest
from deployments.messages import ChatRequest, context_message
from toolspec.calls.prompts import chat_prompt
from toolspec.model.packages import context_tokens, load_tokenizer


class PromptRenderer:
    """The served model's chat template and tokenizer. ``context_tokens``: the model's
    context (from its config unless given)."""

    def __init__(self, model: str, context: int | None = None) -> None:
        self.model = model
        self.tokenizer = load_tokenizer(model)
        self.context_tokens = context or context_tokens(model) or self.tokenizer.model_max_length

    def render(self, request: ChatRequest) -> ChatRequest:
        """``request`` with its prompt ids and call format. Raises AdmissionError (400) when
        the chat template refuses the messages."""
        try:
            ids, call_format = chat_prompt(self.tokenizer, request.messages,
                                           request.openai_tools or None)
        except TemplateError as error:
            raise AdmissionError(400, f"the model's chat template refuses these messages: "
                                 f"{error}", param="messages", code="invalid_messages") from None
        return replace(request, prompt_ids=tuple(ids), prompt_model=self.model,
                       call_format=call_format.name)


def fit_to_context(request: ChatRequest, body: ChatCompletionRequest, context: int
                   ) -> ChatRequest:
    """``request`` with ``max_tokens`` within the context left after its prompt: an explicit
    ``max_tokens`` that does not fit is a 400; the server's default shrinks to fit. A prompt
    that leaves no room at all is a 400."""
    prompt = len(request.prompt_ids or ())
    room = context - prompt
    asked = explicit_max_tokens(body)
    if room < 1 or (asked is not None and request.max_tokens > room):
        raise AdmissionError(400, context_message(prompt, request.max_tokens, context),
                             param=asked or "messages", code="context_length_exceeded")
    return replace(request, max_tokens=min(request.max_tokens, room))
