"""The model's output as OpenAI sees it: content, then tool calls, readable while it grows.

One ``ToolCallStream`` serves both response kinds: streaming feeds each step's text (any number
of tokens at once) and turns what changed into ``delta`` fragments; a plain response feeds the
whole text and reads the result. Both therefore agree by construction.

Calls are found by the format's incremental ``CallScanner``, fed one character at a time so no
boundary is missed however many tokens a step emitted. A call is announced (index, id, name)
once its name is complete; its ``arguments`` are the model's own JSON text of the arguments
object, streamed as it is typed. Content is the prose before the first call with the format's
wrapper (``<tool_call>``, a fence) removed; text that might still open a call is held back
until it is clear. Text after the first call (separators, closing wrappers) is not content.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolspec.formats import CallFormat, CallScanner

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


@dataclass
class _Call:
    start: int
    index: int | None = None  # set when announced
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    done: bool = False
    sent_args: int = 0
    sent_name: bool = False


class ToolCallStream:
    """Splits a growing output into content and tool calls.

    ``call_format`` None: the whole output is content (no tools, or ``tool_choice`` none).
    Mutates: its scanner and what it has handed out, on every ``feed``/``finish``.
    """

    def __init__(self, call_format: CallFormat | None, id_prefix: str) -> None:
        self.call_format = call_format
        self.id_prefix = id_prefix
        self._scanner: CallScanner | None = call_format.scanner() if call_format else None
        self._text = ""
        self._calls: list[_Call] = []
        self._live: _Call | None = None
        self._sent_content = ""
        self._finished = False

    # ---- feeding --------------------------------------------------------------------------

    def feed(self, text: str) -> OutputDelta:
        """Read ``text`` (the next piece of output); return what is new and certain."""
        self._text += text
        if self._scanner is None:
            return OutputDelta(text)
        for char in text:
            self._track(char)
        return self._delta()

    def finish(self) -> OutputDelta:
        """The output is complete: release held-back content."""
        self._finished = True
        if self._live is not None and self._live.index is not None:
            self._live.done = True  # cut off (token limit): hand out what was typed
        return self._delta() if self._scanner is not None else OutputDelta("")

    def _track(self, char: str) -> None:
        scanner = self._scanner
        was_open = scanner.arguments_open
        completed = len(scanner.calls)
        scanner.feed(char)
        live = self._live
        if scanner.inside_call:
            if live is None or live.start != scanner.current_call_start:
                live = self._live = _Call(scanner.current_call_start)
                self._calls.append(live)
            if live.name is None and scanner.tool_name is not None:
                live.name = scanner.tool_name
                live.index = sum(1 for c in self._calls if c.index is not None)
            if live.args_start is None and scanner.arguments_start is not None:
                live.args_start = scanner.arguments_start
            if was_open and not scanner.arguments_open:
                live.args_end = len(scanner.text)
        elif live is not None:
            finished = len(scanner.calls) > completed and scanner.calls[-1].start == live.start
            if finished and live.name is None and scanner.calls[-1].name is not None:
                live.name = scanner.calls[-1].name  # e.g. the name came after the arguments
                live.index = sum(1 for c in self._calls if c.index is not None)
            if finished and live.args_start is not None and live.args_end is None:
                live.args_end = len(scanner.text)
            live.done = True
            self._live = None

    # ---- reading --------------------------------------------------------------------------

    def _delta(self) -> OutputDelta:
        return OutputDelta(self._content_delta(), tuple(self._call_deltas()))

    def _call_deltas(self) -> list[ToolCallDelta]:
        deltas = []
        for call in self._calls:
            if call.index is None:
                continue
            arguments = self._arguments(call)[call.sent_args:]
            if call.sent_name and not arguments:
                continue
            first = not call.sent_name
            call.sent_name = True
            call.sent_args += len(arguments)
            deltas.append(ToolCallDelta(call.index, arguments, self._id(call) if first else None,
                                        call.name if first else None))
        return deltas

    def _arguments(self, call: _Call) -> str:
        if call.args_start is None:
            return "{}" if call.done else ""
        return self._text[call.args_start: call.args_end if call.args_end else len(self._text)]

    def _id(self, call: _Call) -> str:
        return f"call_{self.id_prefix}_{call.index}"

    def _first_call_start(self) -> int | None:
        return next((c.start for c in self._calls if c.index is not None), None)

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
        return [FinishedCall(self._id(c), c.name or "", self._arguments(c))
                for c in self._calls if c.index is not None]


def _without_opener(prefix: str, call_format: CallFormat | None) -> str:
    """``prefix`` (the text before a call's ``{``) without the wrapper that opens the call."""
    trimmed = prefix.rstrip()
    format_openers = (call_format.block_open, call_format.call_open) if call_format else ()
    for opener in (*format_openers, *_GENERIC_OPENERS):
        opener = opener.strip()
        if opener and trimmed.endswith(opener):
            return trimmed[: -len(opener)]
    return prefix
