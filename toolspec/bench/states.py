"""Which tool-call state (free text, tool name, parameter name, value, ...) each output token
was written in, and how many tokens of each state verification steps accepted from drafts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.sim import token_states
from toolspec.calls.formats import CallFormat
from toolspec.core.engine import StepStats


def state_counts(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int],
                 steps: Sequence[StepStats], call_format: CallFormat, start: int = 1
                 ) -> tuple[dict[str, int], dict[str, int]]:
    """(tokens, drafted) per state over the tokens the ``steps`` produced, from ``start`` on (1:
    the prefill chose the first token alone; 0: ``steps`` begins with the prefill's
    verification); a step's first ``accepted`` tokens came from its draft."""
    states = token_states(tokenizer, tokens, call_format)
    written: Counter[str] = Counter()
    drafted: Counter[str] = Counter()
    position = start
    for step in steps:
        for offset in range(step.emitted):
            state = states[position + offset].value
            written[state] += 1
            if offset < step.accepted:
                drafted[state] += 1
        position += step.emitted
    return dict(written), dict(drafted)


def acceptance_by_state(rows: Iterable[tuple[Mapping[str, int], Mapping[str, int]]]
                        ) -> dict[str, dict[str, float]]:
    """Summed (tokens, drafted) per state: ``{state: {"tokens", "drafted", "fraction"}}``."""
    written: Counter[str] = Counter()
    drafted: Counter[str] = Counter()
    for tokens, accepted in rows:
        written.update(tokens)
        drafted.update(accepted)
    return {state: {"tokens": count, "drafted": drafted[state],
                    "fraction": drafted[state] / count if count else 0.0}
            for state, count in sorted(written.items())}
