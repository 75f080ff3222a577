"""Text deltas of a generation that grows a few tokens at a time, safe to show as they come.

Decoding the whole output again at every step (outputs are short) keeps token merges right; the
tail is held back while it may still change: an incomplete UTF-8 character (decoded as U+FFFD)
or the beginning of a stop string that the next tokens could complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"


class TextDeltas:
    """The new visible text after each step. Mutates: how much text it has handed out."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 stop_strings: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self._hold = max((len(s) for s in stop_strings), default=1) - 1
        self.sent = ""

    def update(self, generated: Sequence[int]) -> str:
        """The text that ``generated`` adds to what was handed out, minus its unstable tail."""
        text = self.tokenizer.decode(generated, skip_special_tokens=True).rstrip(_INCOMPLETE)
        return self._advance(text[: len(text) - self._hold] if self._hold else text)

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the output, already cut at its stop string)."""
        return self._advance(final_text)

    def _advance(self, visible: str) -> str:
        # A tokenizer whose decode of a longer sequence rewrites earlier text (rare clean-up
        # rules) cannot take back what was sent: hold until the text agrees again.
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta = visible[len(self.sent):]
        self.sent = visible
        return delta
