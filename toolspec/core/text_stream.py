"""Text deltas of a generation that grows a few tokens at a time, safe to show as they come.

The text is the request's one decoding of its output (``toolspec.calls.output``), stable already (no
half character); the tail is held back while it may still be cut: the beginning of a stop
string that the next tokens could complete.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextDeltas:
    """The new visible text after each step. Mutates: how much text it has handed out."""

    def __init__(self, stop_strings: Sequence[str] = ()) -> None:
        self._hold = max((len(s) for s in stop_strings), default=1) - 1
        self.sent = ""

    def update(self, text: str) -> str:
        """What the output's ``text`` adds to what was handed out, minus its unstable tail."""
        return self._advance(text[: len(text) - self._hold] if self._hold else text)

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the output, already cut at its stop string)."""
        return self._advance(final_text)

    def _advance(self, visible: str) -> str:
        if len(visible) <= len(self.sent) or not visible.startswith(self.sent):
            return ""
        delta = visible[len(self.sent):]
        self.sent = visible
        return delta
