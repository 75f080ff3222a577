"""When generation ends: an end-of-sequence token, a stop string, or the token limit.

A speculative step can emit several tokens at once; the scanner looks at them one by one, so the
output ends at exactly the token where plain decoding would have ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from toolspec.calls.output import RequestOutput

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class StopDecision:
    keep: int  # how many of the newly emitted tokens belong to the output
    reason: FinishReason
    stop_string: str | None = None


class StopScanner:
    """Appends a step's tokens to the output one by one, up to the token that ends it.

    Mutates: the output it is given; remembers how much text it has searched for stop strings.
    """

    def __init__(
        self,
        stop_token_ids: frozenset[int],
        stop_strings: Sequence[str],
        max_new_tokens: int,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if any(not s for s in stop_strings):
            raise ValueError("stop strings must be non-empty")
        self.stop_token_ids = stop_token_ids
        self.stop_strings = tuple(stop_strings)
        self.max_new_tokens = max_new_tokens
        self._searched_chars = 0

    def append(self, output: RequestOutput, emitted: Sequence[int]) -> StopDecision | None:
        """Append ``emitted`` to ``output`` in order; the first token that ends the generation
        (an end token, the completion of a stop string, the token limit) is the last one
        appended, and its decision is returned (None: the generation goes on)."""
        for offset, token in enumerate(emitted):
            output.append(token)
            if token in self.stop_token_ids:
                return StopDecision(offset + 1, "stop")
            if self.stop_strings:
                hit = self._stop_string_in(output.text)
                if hit is not None:
                    return StopDecision(offset + 1, "stop", hit)
            if len(output.tokens) >= self.max_new_tokens:
                return StopDecision(offset + 1, "length")
        return None

    def _stop_string_in(self, text: str) -> str | None:
        longest = max(len(s) for s in self.stop_strings)
        # Only text that could hold a stop string ending after the last search is searched.
        window_start = max(0, self._searched_chars - longest + 1)
        self._searched_chars = len(text)
        found = [(text.find(s, window_start), s) for s in self.stop_strings]
        found = [(at, s) for at, s in found if at >= 0]
        return min(found)[1] if found else None


def cut_at_stop_string(text: str, stop_string: str | None) -> str:
    """The output text without the stop string and what follows it (OpenAI semantics)."""
    if stop_string is None:
        return text
    at = text.find(stop_string)
    return text if at < 0 else text[:at]
