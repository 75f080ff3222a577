"""One request's output, decoded once and parsed once, as it grows.

``RequestOutput`` is the only reading of a request's output: the job appends each emitted token
(``IncrementalDetokenizer`` turns it into text once: no whole-output decode per step), the stop
checks read that text, and ``OutputParse`` feeds it to the format's incremental ``CallScanner``
(one per request) and notes where each call, its name and its arguments lie. The drafter drafts
from that scanner; the replica's decode-time library lookups and the OpenAI response (content,
tool-call deltas) read the call spans it hands out with each step (``CallSpan``, immutable: they
cross threads and processes); the call library stores the calls it found.

Mutates: everything here grows on ``append``/``feed``; nothing else writes to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import CallFormat, CallScanner, ToolCall

_INCOMPLETE = "\ufffd"  # what a token ending inside a multi-byte character decodes to


class IncrementalDetokenizer:
    """Token ids in, their text out, one token at a time, each token decoded about twice in
    all. Text is handed out once it is stable: a token that ends inside a multi-byte character
    waits for the rest. Special tokens (end-of-turn) are not text.

    Each append decodes a window from the last stable boundary only (as serving engines do),
    so the text is the whole sequence's decode without decoding the whole sequence again.
    Mutates: its tokens, text and window on ``append``/``flush``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.text = ""
        self._window = 0  # first token of the window decoded each time
        self._stable = 0  # tokens whose text is in ``text``

    def append(self, token: int) -> str:
        """Add ``token``; return the text it made stable (often "" mid-character)."""
        self.tokens.append(token)
        before = self._decode(self.tokens[self._window: self._stable])
        after = self._decode(self.tokens[self._window:])
        if len(after) <= len(before) or after.endswith(_INCOMPLETE):
            return ""
        delta = after[len(before):]
        self._window, self._stable = self._stable, len(self.tokens)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The output is complete: the text still held (an unfinished character) is given."""
        before = self._decode(self.tokens[self._window: self._stable])
        after = self._decode(self.tokens[self._window:])
        delta = after[len(before):] if len(after) > len(before) else ""
        self._window = self._stable = len(self.tokens)
        self.text += delta
        return delta

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False) if tokens else ""


@dataclass(frozen=True)
class CallSpan:
    """Where one call lies in the output text (offsets into it): from its opening brace, its
    name once complete, its arguments object (end None while open). ``done``: the call's
    object closed, or the text broke off from it (the arguments run to the end then)."""

    start: int
    name: str | None = None
    arguments_start: int | None = None
    arguments_end: int | None = None
    done: bool = False

    def arguments(self, text: str) -> str:
        """The call's arguments as the model wrote them (JSON text; "{}" for a finished call
        written without any), as far as ``text`` goes."""
        if self.arguments_start is None:
            return "{}" if self.done else ""
        end = self.arguments_end if self.arguments_end is not None else len(text)
        return text[self.arguments_start: min(end, len(text))]


class OutputParse:
    """The output text through one ``CallScanner`` (``call_format`` None: text only, no calls).

    Fed one character at a time, so no boundary is missed however much text a step added: a
    call is noted when its object opens, named once its name is complete (also when the name
    comes after the arguments), and ended when its object closes or breaks off.
    Mutates: the scanner and the spans, on ``feed``.
    """

    def __init__(self, call_format: CallFormat | None) -> None:
        self.call_format = call_format
        self.scanner: CallScanner | None = call_format.scanner() if call_format else None
        self._text: list[str] = []
        self._spans: list[CallSpan] = []
        self._live: int | None = None  # index in ``_spans`` of the call being typed

    @property
    def text(self) -> str:
        return self.scanner.text if self.scanner is not None else "".join(self._text)

    def feed(self, text: str) -> None:
        if self.scanner is None:
            self._text.append(text)
            return
        for char in text:
            self._track(char)

    @property
    def spans(self) -> tuple[CallSpan, ...]:
        """Every call seen so far, the one being typed last (a snapshot)."""
        return tuple(self._spans)

    def calls(self, within: int | None = None) -> tuple[ToolCall, ...]:
        """The well-formed calls (name and arguments complete), in order; ``within``: only
        those ending in the text's first ``within`` characters (the output cut at a stop
        string)."""
        if self.scanner is None:
            return ()
        return tuple(ToolCall(call.name, call.arguments) for call in self.scanner.calls
                     if call.name is not None and call.arguments is not None
                     and (within is None or call.end <= within))

    def _track(self, char: str) -> None:
        scanner = self.scanner
        was_open = scanner.arguments_open
        completed = len(scanner.calls)
        scanner.feed(char)
        live = self._spans[self._live] if self._live is not None else None
        if scanner.inside_call:
            if live is None or live.start != scanner.current_call_start:
                live = CallSpan(scanner.current_call_start)
                self._live = len(self._spans)
                self._spans.append(live)
            updated = live
            if live.name is None and scanner.tool_name is not None:
                updated = replace(updated, name=scanner.tool_name)
            if live.arguments_start is None and scanner.arguments_start is not None:
                updated = replace(updated, arguments_start=scanner.arguments_start)
            if was_open and not scanner.arguments_open:
                updated = replace(updated, arguments_end=len(scanner.text))
            if updated is not live:
                self._spans[self._live] = updated
        elif live is not None:
            finished = len(scanner.calls) > completed and scanner.calls[-1].start == live.start
            if finished and live.name is None and scanner.calls[-1].name is not None:
                live = replace(live, name=scanner.calls[-1].name)  # named after its arguments
            if finished and live.arguments_start is not None and live.arguments_end is None:
                live = replace(live, arguments_end=len(scanner.text))
            self._spans[self._live] = replace(live, done=True)
            self._live = None


class RequestOutput:
    """A request's output: its tokens, their text (decoded once), and its parse.

    Mutates: all three, on ``append``/``finish``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase,
                 call_format: CallFormat | None) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.parse = OutputParse(call_format)

    @property
    def tokens(self) -> list[int]:
        return self.detokenizer.tokens

    @property
    def text(self) -> str:
        return self.detokenizer.text

    def append(self, token: int) -> None:
        self.parse.feed(self.detokenizer.append(token))

    def finish(self) -> None:
        """No more tokens: text held mid-character is released to the parse."""
        self.parse.feed(self.detokenizer.flush())
