"""Incremental parse of generated text into tool-call structure, one character at a time.

Used by the drafting FSM (where are we in the call, which names and parameters are already
given) and by streaming (which calls are complete). Everything outside a JSON object is free text
(wrappers such as ``<tool_call>`` or fences, prose). A JSON object at the top level — or directly
inside a top-level array — is a call; its ``name`` string is the tool name and its arguments key
(``arguments`` or ``parameters``) holds the parameters. Text that breaks JSON syntax abandons the
object and returns to free text: the drafter then simply stops proposing schema text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class CallState(Enum):
    TEXT = "text"  # outside any call: prose, wrappers, between calls
    CALL_START = "call_start"  # inside a call object, before or between its keys
    CALL_KEY = "call_key"  # typing a key of the call object ("name" / arguments key)
    CALL_COLON = "call_colon"  # after a call key, before its value
    TOOL_NAME = "tool_name"  # typing the tool name
    AFTER_NAME = "after_name"  # tool name done, before the next key
    ARGS_START = "args_start"  # inside the arguments object, expecting a parameter name or '}'
    PARAM_NAME = "param_name"  # typing a parameter name
    PARAM_COLON = "param_colon"  # parameter name done, before its value
    VALUE_STRING = "value_string"  # typing a string value
    VALUE_LITERAL = "value_literal"  # typing a number, true, false or null
    VALUE_NESTED = "value_nested"  # inside an object or array value
    AFTER_VALUE = "after_value"  # a parameter value done, expecting ',' or '}'
    AFTER_ARGS = "after_args"  # arguments object closed, expecting the call's '}'
    OFF_FORMAT = "off_format"  # inside a JSON object that is not a call


class _Expect(Enum):
    KEY = "key"
    COLON = "colon"
    VALUE = "value"
    COMMA = "comma"  # comma or close


class NestedAnchor(Enum):
    """Where, inside an open object or array, the last completed element left off."""

    OPENED = "opened"  # just after its bracket
    AFTER_KEY = "after_key"  # an object's key done; its value (or the colon) comes next
    AFTER_ELEMENT = "after_element"  # a value done; a comma and more, or the closing bracket


@dataclass(frozen=True)
class NestedContainer:
    """One open object or array of the parameter value being typed (outermost first)."""

    is_object: bool
    key: str | None  # an object's key being written or whose value is being written
    keys: tuple[str, ...]  # an object's keys so far
    scalars: tuple[str, ...]  # its string, number and literal values so far, as JSON text
    anchor: NestedAnchor  # where ``CallScanner.anchor`` sits, when this is the innermost one


class _Role(Enum):
    CALL = "call"
    ARGS = "args"
    VALUE = "value"  # nested inside a parameter value
    OTHER = "other"  # an object that is not a call
    CALLS = "calls"  # a top-level array of calls


@dataclass
class _Frame:
    role: _Role
    is_object: bool
    start: int  # offset of the opening bracket in the scanned text
    expect: _Expect = _Expect.KEY
    key: str | None = None  # the key being written or whose value is being written
    keys: list[str] = field(default_factory=list)
    name: str | None = None  # a call frame's tool name, once complete
    values: int = 0  # values completed in it (an array's elements, an object's values)
    scalars: list[str] = field(default_factory=list)  # its string and literal values, as JSON


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict[str, Any] | None
    text: str  # the call object's JSON text
    start: int  # offsets in the scanned text
    end: int


_WHITESPACE = " \t\r\n"
_LITERAL_CHARS = set("0123456789+-.eEtruefalsn")


class CallScanner:
    """Consumes text incrementally and reports the tool-call state at its end.

    ``arguments_keys`` are the keys that hold a call's parameters. Mutates: its parse state on
    every ``feed``.
    """

    def __init__(self, arguments_keys: tuple[str, ...] = ("arguments", "parameters")) -> None:
        self.arguments_keys = arguments_keys
        self.text = ""
        self.calls: list[ParsedCall] = []
        self._stack: list[_Frame] = []
        self._string: list[str] | None = None  # characters of the string being read
        self._string_is_key = False
        self._escape: str | None = None  # pending escape sequence (after a backslash)
        self._literal: list[str] | None = None
        self._bracket_pending = False  # saw '[' in free text; a '{' next makes it a call list
        self._bracket_start = 0
        # Offset just past the last completed element (bracket, key, value): what follows it is
        # only separators or the element being typed, which drafts are matched against.
        self.anchor = 0

    # ---- public view ----------------------------------------------------------------------

    def feed(self, text: str) -> None:
        for char in text:
            self._step(char)
            self.text += char

    @property
    def state(self) -> CallState:
        if not self._stack:
            return CallState.TEXT
        frame = self._stack[-1]
        if frame.role is _Role.CALLS:
            return CallState.TEXT
        if frame.role is _Role.OTHER:
            return CallState.OFF_FORMAT
        if frame.role is _Role.VALUE:
            return CallState.VALUE_NESTED
        in_string = self._string is not None
        if frame.role is _Role.CALL:
            if in_string:
                if self._string_is_key:
                    return CallState.CALL_KEY
                return CallState.TOOL_NAME if frame.key == "name" else CallState.OFF_FORMAT
            if self._literal is not None:
                return CallState.OFF_FORMAT
            if frame.expect in (_Expect.COLON, _Expect.VALUE):
                return CallState.CALL_COLON
            if frame.expect is _Expect.COMMA:
                if frame.keys and frame.keys[-1] in self.arguments_keys:
                    return CallState.AFTER_ARGS
                return (CallState.AFTER_NAME if frame.keys and frame.keys[-1] == "name"
                        else CallState.CALL_START)
            return CallState.CALL_START
        # arguments object
        if in_string:
            return CallState.PARAM_NAME if self._string_is_key else CallState.VALUE_STRING
        if self._literal is not None:
            return CallState.VALUE_LITERAL
        return {
            _Expect.KEY: CallState.ARGS_START,
            _Expect.COLON: CallState.PARAM_COLON,
            _Expect.VALUE: CallState.PARAM_COLON,
            _Expect.COMMA: CallState.AFTER_VALUE,
        }[frame.expect]

    @property
    def partial(self) -> str:
        """The part of the current string or literal typed so far (unescaped)."""
        if self._string is not None:
            return "".join(self._string)
        return "".join(self._literal) if self._literal is not None else ""

    def _frame(self, role: _Role) -> _Frame | None:
        for frame in reversed(self._stack):
            if frame.role is role:
                return frame
        return None

    @property
    def tool_name(self) -> str | None:
        """The current call's tool name, once its string is complete."""
        call = self._frame(_Role.CALL)
        return call.name if call else None

    @property
    def call_keys(self) -> tuple[str, ...]:
        """Keys completed so far in the current call object."""
        call = self._frame(_Role.CALL)
        return tuple(call.keys) if call else ()

    @property
    def parameter(self) -> str | None:
        """The parameter whose value is being written (or whose name was just completed)."""
        args = self._frame(_Role.ARGS)
        return args.key if args else None

    @property
    def given_parameters(self) -> tuple[str, ...]:
        """Parameter names completed so far in the current call (a key counts once closed)."""
        args = self._frame(_Role.ARGS)
        return tuple(args.keys) if args else ()

    @property
    def typing_key(self) -> bool:
        """Whether the string being typed is an object key (of a call, arguments or a nested
        value), not a value."""
        return self._string is not None and self._string_is_key

    @property
    def typing_string(self) -> bool:
        """Whether a string (key or value) is being typed: its opening quote is in the text."""
        return self._string is not None

    @property
    def nested_value_start(self) -> int | None:
        """Offset of the ``{`` or ``[`` of the parameter value being typed, while it is an
        object or array that is still open."""
        value = next((frame for frame in self._stack if frame.role is _Role.VALUE), None)
        return value.start if value else None

    @property
    def nested_containers(self) -> tuple[NestedContainer, ...]:
        """The open objects and arrays of the parameter value being typed, outermost first
        (empty outside such a value)."""
        return tuple(NestedContainer(frame.is_object, frame.key, tuple(frame.keys),
                                     tuple(frame.scalars), self._nested_anchor(frame))
                     for frame in self._stack if frame.role is _Role.VALUE)

    def _nested_anchor(self, frame: _Frame) -> NestedAnchor:
        if frame is not self._stack[-1]:
            return NestedAnchor.AFTER_KEY if frame.is_object else NestedAnchor.AFTER_ELEMENT
        if frame.is_object:
            typing_key = self._string is not None and self._string_is_key
            if frame.expect is _Expect.KEY or typing_key:
                return NestedAnchor.AFTER_ELEMENT if frame.keys else NestedAnchor.OPENED
            return NestedAnchor.AFTER_ELEMENT if frame.expect is _Expect.COMMA \
                else NestedAnchor.AFTER_KEY
        if frame.expect is _Expect.COMMA or frame.values:
            return NestedAnchor.AFTER_ELEMENT
        return NestedAnchor.OPENED

    @property
    def arguments_open(self) -> bool:
        """Whether the current call's arguments object has been opened."""
        return self._frame(_Role.ARGS) is not None

    @property
    def arguments_start(self) -> int | None:
        """Offset of the ``{`` of the current call's arguments object, while it is open."""
        args = self._frame(_Role.ARGS)
        return args.start if args else None

    @property
    def inside_call(self) -> bool:
        return self._frame(_Role.CALL) is not None

    @property
    def current_call_start(self) -> int | None:
        """Offset of the ``{`` of the call being written, if one is open."""
        call = self._frame(_Role.CALL)
        return call.start if call else None

    @property
    def first_call_start(self) -> int | None:
        """Offset of the first call's ``{`` (or of the call list's ``[``), if one has begun."""
        if self.calls:
            return self.calls[0].start
        return self._stack[0].start if self._stack else None

    # ---- the character machine ------------------------------------------------------------

    def _reset(self) -> None:
        """Abandon malformed JSON: back to free text."""
        self.anchor = len(self.text) + 1
        self._stack.clear()
        self._string = None
        self._literal = None
        self._escape = None

    def _step(self, char: str) -> None:
        if self._string is not None:
            self._string_char(char)
            return
        if self._literal is not None:
            if char in _LITERAL_CHARS:
                self._literal.append(char)
                return
            if self._stack:
                self._stack[-1].scalars.append("".join(self._literal))
            self._literal = None
            self.anchor = len(self.text)
            self._value_done()
        if not self._stack:
            self._text_char(char)
            return
        frame = self._stack[-1]
        if char in _WHITESPACE:
            return
        if frame.expect is _Expect.KEY:
            if char == '"':
                self._open_string(is_key=True)
            elif char == "}" and frame.is_object:
                self._close(char)
            else:
                self._reset()
        elif frame.expect is _Expect.COLON:
            if char == ":":
                frame.expect = _Expect.VALUE
            else:
                self._reset()
        elif frame.expect is _Expect.VALUE:
            self._value_start(char, frame)
        else:  # comma or close
            if char == ",":
                frame.expect = _Expect.KEY if frame.is_object else _Expect.VALUE
            elif char in "}]":
                self._close(char)
            else:
                self._reset()

    def _text_char(self, char: str) -> None:
        if char == "{":
            self.anchor = len(self.text) + 1
            self._stack.append(_Frame(_Role.CALL, True, len(self.text)))
            if self._bracket_pending:
                self._stack.insert(0, _Frame(_Role.CALLS, False, self._bracket_start,
                                             expect=_Expect.COMMA))
            self._bracket_pending = False
        elif char == "[":
            self._bracket_pending = True
            self._bracket_start = len(self.text)
        elif char not in _WHITESPACE:
            self._bracket_pending = False

    def _value_start(self, char: str, frame: _Frame) -> None:
        if char == '"':
            self._open_string(is_key=False)
        elif char in "{[":
            self.anchor = len(self.text) + 1
            role = self._child_role(frame)
            self._stack.append(_Frame(role, char == "{", len(self.text),
                                      expect=_Expect.KEY if char == "{" else _Expect.VALUE))
        elif char in "]" and not frame.is_object:
            self._close(char)  # empty array
        elif char in _LITERAL_CHARS:
            self._literal = [char]
        else:
            self._reset()

    def _child_role(self, frame: _Frame) -> _Role:
        if frame.role is _Role.CALL:
            return _Role.ARGS if frame.key in self.arguments_keys else _Role.OTHER
        if frame.role is _Role.CALLS:
            return _Role.CALL
        if frame.role is _Role.ARGS:
            return _Role.VALUE
        return frame.role

    def _open_string(self, is_key: bool) -> None:
        self._string = []
        self._string_is_key = is_key

    def _string_char(self, char: str) -> None:
        if self._escape is not None:
            self._escape += char
            if self._escape[0] == "u" and len(self._escape) < 5:
                return
            try:
                self._string.append(json.loads(f'"\\{self._escape}"'))
            except json.JSONDecodeError:
                self._reset()
                return
            self._escape = None
            return
        if char == "\\":
            self._escape = ""
        elif char == '"':
            value = "".join(self._string)
            self._string = None
            self.anchor = len(self.text) + 1
            frame = self._stack[-1]
            if self._string_is_key:
                frame.key = value
                frame.keys.append(value)
                frame.expect = _Expect.COLON
            else:
                if frame.role is _Role.CALL and frame.key == "name":
                    frame.name = value
                frame.scalars.append(json.dumps(value, ensure_ascii=False))
                self._value_done()
        else:
            self._string.append(char)

    def _value_done(self) -> None:
        if self._stack:
            self._stack[-1].expect = _Expect.COMMA
            self._stack[-1].values += 1

    def _close(self, char: str) -> None:
        frame = self._stack[-1]
        if frame.is_object != (char == "}"):
            self._reset()
            return
        self._stack.pop()
        self.anchor = len(self.text) + 1
        if frame.role is _Role.CALL:
            self._record_call(frame, len(self.text) + 1)
        if frame.role is _Role.CALLS or not self._stack:
            return
        self._value_done()

    def _record_call(self, frame: _Frame, end: int) -> None:
        raw = self.text[frame.start:end - 1] + "}"
        try:
            decoded = json.loads(raw)
        except json.JSONDecodeError:
            decoded = None
        name = decoded.get("name") if isinstance(decoded, dict) else None
        arguments = None
        if isinstance(decoded, dict):
            for key in self.arguments_keys:
                if isinstance(decoded.get(key), dict):
                    arguments = decoded[key]
                    break
        self.calls.append(ParsedCall(name if isinstance(name, str) else None, arguments, raw,
                                     frame.start, end))
