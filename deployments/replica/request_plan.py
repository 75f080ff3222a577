"""A chat request as an engine runs it: prompt ids, call format, stops, sampling and grammar.

Both engines a replica can hold (the project's own, vLLM's) plan a request the same way, so a
request means the same thing whichever serves it: the prompt the ingress rendered (or the
model's chat template), the context check, a single call ending the output when parallel calls
are off, and — for constrained requests — the Lark grammar (llguidance) of its tool calls or of
its ``response_format``: the project's engine compiles it into token masks, vLLM's structured
outputs (guidance backend) take it as it is. Nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from deployments.messages import ChatRequest, ContextLengthError, context_message
from toolspec.calls.formats import CallFormat, get_format
from toolspec.calls.prompts import chat_prompt, conversation_text
from toolspec.calls.tool_grammar import answer_grammar, tool_call_grammar
from toolspec.core.sampling import SamplingParams


@dataclass(frozen=True)
class RequestPlan:
    """What an engine runs for one request. ``grammar``: Lark text decoding is constrained by
    (None: unconstrained, lossless speculation of the model's own output)."""

    prompt_ids: tuple[int, ...]
    call_format: CallFormat
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    grammar: str | None
    conversation: str


def plan_request(request: ChatRequest, tokenizer: PreTrainedTokenizerBase, model: str,
                 context_tokens: int, added_tokens: Mapping[str, int]) -> RequestPlan:
    """``request`` planned for ``model`` (its ``tokenizer``, a context of ``context_tokens``;
    ``added_tokens``: the tokenizer's added-token texts and ids, which grammars write as ids).
    Raises ``ContextLengthError`` when the prompt and ``max_tokens`` do not fit."""
    if request.prompt_ids is not None and request.prompt_model == model \
            and request.call_format is not None:
        prompt, call_format = list(request.prompt_ids), get_format(request.call_format)
    else:  # the ingress rendered no prompt for this model: the chat template here
        prompt, call_format = chat_prompt(tokenizer, request.messages,
                                          request.openai_tools or None)
    if len(prompt) + request.max_tokens > context_tokens:
        raise ContextLengthError(context_message(len(prompt), request.max_tokens,
                                                 context_tokens))
    stop = request.stop
    if request.parses_calls and not request.parallel_calls and call_format.call_close:
        stop = (*stop, call_format.call_close)  # one call, then the output ends
    return RequestPlan(
        prompt_ids=tuple(prompt), call_format=call_format, max_tokens=request.max_tokens,
        stop=stop, sampling=SamplingParams(request.temperature, request.top_p, request.top_k,
                                           seed=request.seed),
        grammar=_grammar(request, call_format, added_tokens),
        conversation=conversation_text(request.messages))


def _grammar(request: ChatRequest, call_format: CallFormat, added_tokens: Mapping[str, int]
             ) -> str | None:
    """The Lark text a constrained request decodes under (None: unconstrained)."""
    if not request.constrained:
        return None
    if not request.parses_calls:  # response_format alone
        return answer_grammar(request.answer_schema)
    shape = "calls" if request.forces_call else "text_or_calls"
    return tool_call_grammar(request.tools.tools, call_format, shape, request.parallel_calls,
                             added_tokens, None if request.forces_call else request.answer_schema)
