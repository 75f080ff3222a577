"""Known outputs replayed through the ToolSpec proposer as vLLM drives it: one chain per step.

``toolspec sim --chains K`` reads this where ``simulate`` replays trees through the project's
own engine, so the two compare on the same items: what verifying one chain per request (vLLM's
speculative decoding) loses against verifying a tree. Acceptance is greedy, as vLLM's: the
chain's longest prefix equal to the output, then the target's own next token.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from toolspec.bench.sim import SimTarget
from toolspec.library import CallLibrary
from toolspec.vllm.request import DraftingRequest, past_calls
from toolspec.vllm.sessions import DraftSessions, SessionSettings


@dataclass
class ChainReport:
    """Totals of a replay. ``steps`` count verifications after the prefill's token."""

    items: int = 0
    tokens: int = 0
    steps: int = 0
    longest_chain: int = 0
    drafting_s: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 1.0

    @property
    def drafting_ms_per_step(self) -> float:
        return 1000 * self.drafting_s / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {"items": self.items, "tokens": self.tokens, "steps": self.steps,
                "tokens_per_step": round(self.tokens_per_step, 4),
                "longest_chain": self.longest_chain,
                "drafting_ms_per_step": round(self.drafting_ms_per_step, 3)}


def drafting_request(target: SimTarget, tenant: str, library: CallLibrary | None
                     ) -> DraftingRequest:
    """What the replica would put in the target's ``SamplingParams.extra_args``: its tools,
    call format, conversation, and ``tenant``'s past calls of those tools in ``library``."""
    tools = target.request.tools
    return DraftingRequest(
        tenant=tenant, call_format=target.request.call_format.name,
        tools=tuple(tool.openai() for tool in tools),
        conversation=target.request.conversation,
        past_calls=past_calls(library, tenant, tools.names) if library is not None else ())


def replay_one(sessions: DraftSessions, request_id: str, prompt: Sequence[int],
               output: Sequence[int], limit: int) -> tuple[int, list[list[int]]]:
    """Decode ``output`` as vLLM would with greedy acceptance: the first token comes from the
    prefill, then each step verifies the proposer's chain. Returns the steps and the chains.
    Mutates: ``sessions`` (the request's drafter)."""
    context, emitted, steps, chains = [*prompt, output[0]], 1, 0, []
    while emitted < len(output):
        chain = sessions.propose(request_id, context, limit)
        chains.append(chain)
        accepted = 0
        while accepted < len(chain) and emitted + accepted < len(output) \
                and chain[accepted] == output[emitted + accepted]:
            accepted += 1
        step = list(output[emitted:emitted + accepted + 1])
        context.extend(step)
        emitted += len(step)
        steps += 1
    return steps, chains


def replay_chains(tokenizer: PreTrainedTokenizerBase, targets: Iterable[SimTarget],
                  settings: SessionSettings, library: CallLibrary | None = None,
                  tenant: str = "default") -> ChainReport:
    """Every target one after another for ``tenant``, each request carrying the calls the
    earlier ones made (as the replica's library view holds them, when a ``library`` is given).
    Mutates: ``library`` (each target's calls are added after it)."""
    sessions = DraftSessions(tokenizer, settings)
    report = ChainReport()
    try:
        for index, target in enumerate(targets):
            if not target.output_ids:
                continue
            request_id = f"replay-{index}"
            sessions.start(request_id, target.prompt_ids,
                           drafting_request(target, tenant, library))
            began = time.perf_counter()
            steps, chains = replay_one(sessions, request_id, target.prompt_ids,
                                       target.output_ids, settings.max_tokens)
            report.drafting_s += time.perf_counter() - began
            sessions.retire(())
            report.items += 1
            report.tokens += len(target.output_ids) - 1
            report.steps += steps
            report.longest_chain = max([report.longest_chain, *map(len, chains)])
            if library is not None:
                text = tokenizer.decode(target.output_ids, skip_special_tokens=True)
                library.remember(target.request.call_format.parse(text),
                                 target.request.tools.names, tenant)
    finally:
        sessions.close()
    return report
