"""The model's output as OpenAI sees it: content, then tool calls, readable while it grows.

One ``ToolCallStream`` serves both response kinds: streaming feeds each step's text (any number
of tokens at once) and turns what changed into ``delta`` fragments; a plain response feeds the
whole text and reads the result. Both therefore agree by construction.

It parses nothing: the replica's one parse of the request's output (``toolspec.calls.output``) says
with each step where the calls lie. A call is announced (index, id, name) once its name is
complete and its start visible; its ``arguments`` are the model's own JSON text of the
arguments object, streamed as it is typed. Content is the prose before the first call with the
format's wrapper (``<tool_call>``, a fence) removed; text that might still open a call is held
back until it is clear. Text after the first call (separators, closing wrappers) is not content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from toolspec.calls.formats import CallFormat
from toolspec.calls.output import CallSpan

# A call may be opened by a wrapper starting with one of these; prose is held from the first.
_OPENER_CHARS = "<`[{"
_GENERIC_OPENERS = ("<tool_call>", "```json", "```", "[")


@dataclass(frozen=True)
class ToolCallDelta:
    """New text of one call: ``name`` and ``id`` only in its first fragment."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class OutputDelta:
    content: str
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass(frozen=True)
class FinishedCall:
    id: str
    name: str
    arguments: str  # a JSON object, as a string


class ToolCallStream:
    """Splits a growing output into content and tool calls, from the replica's parse of it.

    ``call_format`` None: the whole output is content (no tools, or ``tool_choice`` none).
    Mutates: the text and call spans it has been given, and what it has handed out.
    """

    def __init__(self, call_format: CallFormat | None, id_prefix: str) -> None:
        self.call_format = call_format
        self.id_prefix = id_prefix
        self._text = ""
        self._spans: tuple[CallSpan, ...] = ()
        self._sent_args: dict[int, int] = {}  # by call index: argument characters handed out
        self._sent_content = ""
        self._finished = False

    # ---- feeding --------------------------------------------------------------------------

    def feed(self, text: str, calls: Sequence[CallSpan] = ()) -> OutputDelta:
        """Take the next piece of visible ``text`` and where the output's ``calls`` lie (the
        latest parse); return what is new and certain."""
        self._text += text
        if self.call_format is None:
            return OutputDelta(text)
        self._spans = tuple(calls) or self._spans
        return self._delta()

    def finish(self) -> OutputDelta:
        """The output is complete: release held-back content; a call cut off (token limit)
        is handed out as typed."""
        self._finished = True
        self._spans = tuple(replace(span, done=True) for span in self._spans)
        return self._delta() if self.call_format is not None else OutputDelta("")

    def _announced(self) -> list[CallSpan]:
        """The calls the client is told of, in order (their index): named, and begun within
        the visible text."""
        return [span for span in self._spans
                if span.name is not None and span.start < len(self._text)]

    # ---- reading --------------------------------------------------------------------------

    def _delta(self) -> OutputDelta:
        return OutputDelta(self._content_delta(), tuple(self._call_deltas()))

    def _call_deltas(self) -> list[ToolCallDelta]:
        deltas = []
        for index, span in enumerate(self._announced()):
            sent = self._sent_args.get(index)
            arguments = span.arguments(self._text)[sent or 0:]
            if sent is not None and not arguments:
                continue
            self._sent_args[index] = (sent or 0) + len(arguments)
            first = sent is None
            deltas.append(ToolCallDelta(index, arguments, self._id(index) if first else None,
                                        span.name if first else None))
        return deltas

    def _id(self, index: int) -> str:
        return f"call_{self.id_prefix}_{index}"

    def _first_call_start(self) -> int | None:
        announced = self._announced()
        return announced[0].start if announced else None

    def _content_so_far(self) -> str:
        start = self._first_call_start()
        if start is not None:
            return _without_opener(self._text[:start], self.call_format)
        if self._finished:
            return self._text
        held = [at for at in (self._text.find(c) for c in _OPENER_CHARS) if at >= 0]
        return self._text[: min(held)] if held else self._text

    def _content_delta(self) -> str:
        content = self._content_so_far()
        if not content.strip() or not content.startswith(self._sent_content):
            return ""
        delta = content[len(self._sent_content):]
        self._sent_content = content
        return delta

    # ---- the whole output -----------------------------------------------------------------

    @property
    def content(self) -> str | None:
        """The content of the complete output (None when it is only tool calls)."""
        content = self._content_so_far()
        if self._first_call_start() is not None and not content.strip():
            return None
        return content

    @property
    def tool_calls(self) -> list[FinishedCall]:
        return [FinishedCall(self._id(index), span.name or "", span.arguments(self._text))
                for index, span in enumerate(self._announced())]


def _without_opener(prefix: str, call_format: CallFormat | None) -> str:
    """``prefix`` (the text before a call's ``{``) without the wrapper that opens the call."""
    trimmed = prefix.rstrip()
    format_openers = (call_format.block_open, call_format.call_open) if call_format else ()
    for opener in (*format_openers, *_GENERIC_OPENERS):
        opener = opener.strip()
        if opener and trimmed.endswith(opener):
            return trimmed[: -len(opener)]
    return prefix
