"""``ToolCallStream``: however the output is cut into steps, the deltas add up to the whole
answer, and the whole answer is what a one-shot parse gives."""

from __future__ import annotations

import json
import random

import pytest

from deployments.http.tool_stream import OutputDelta, ToolCallStream
from toolspec.calls.formats import get_format
from toolspec.calls.output import OutputParse

OUTPUTS = [
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"x": 1, "y": {"z": [1, 2]}}}'
               '\n</tool_call>'),
    ("hermes", 'Sure {braces} here.\n<tool_call>\n'
               '{"name": "a", "arguments": {"s": "}{\\"]"}}\n</tool_call>'),
    ("json", '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'),
    ("json", '```json\n{\n  "name": "a",\n  "arguments": {\n    "x": "v"\n  }\n}\n```'),
    ("json", '{"arguments": {"x": 2}, "name": "late"}'),
    ("apibank", '```<tool_call>\n{"name": "a", "parameters": {"k": "v"}}\n'
                '{"name": "b", "parameters": {"n": null}}\n</tool_call>\n```'),
    ("json", "No call needed: the answer is 4 < 5."),
]


class Replica:
    """The replica's side: the request's one parse, fed the same pieces, hands the stream
    each step's text with the spans it found."""

    def __init__(self, format_name: str, hold: int = 0) -> None:
        self.parse = OutputParse(get_format(format_name))
        self.stream = ToolCallStream(get_format(format_name), "t")
        self.hold = hold  # characters the visible text lags the parse (a stop string's)
        self.sent = 0

    def step(self, piece: str) -> OutputDelta:
        self.parse.feed(piece)
        visible = max(self.sent, len(self.parse.text) - self.hold)
        text, self.sent = self.parse.text[self.sent: visible], visible
        return self.stream.feed(text, self.parse.spans)

    def finish(self) -> OutputDelta:
        last = self.stream.feed(self.parse.text[self.sent:], self.parse.spans)
        end = self.stream.finish()
        return OutputDelta(last.content + end.content, last.tool_calls + end.tool_calls)


def whole(format_name: str, text: str) -> ToolCallStream:
    replica = Replica(format_name)
    replica.step(text)
    replica.finish()
    return replica.stream


@pytest.mark.parametrize("format_name, text", OUTPUTS)
def test_deltas_add_up_to_the_whole_answer_for_any_step_split(format_name: str, text: str) -> None:
    expected = whole(format_name, text)
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        replica = Replica(format_name, hold=rng.choice([0, 0, 11]))
        content, calls = "", {}
        for delta in [replica.step(p) for p in pieces] + [replica.finish()]:
            content += delta.content
            for fragment in delta.tool_calls:
                if fragment.index not in calls:
                    assert fragment.name is not None and fragment.id is not None
                    calls[fragment.index] = [fragment.name, ""]
                else:
                    assert fragment.name is None
                calls[fragment.index][1] += fragment.arguments
        assert content == (expected.content or "")
        assert [tuple(calls[i]) for i in sorted(calls)] == \
            [(c.name, c.arguments) for c in expected.tool_calls]


@pytest.mark.parametrize("format_name, text", OUTPUTS)
def test_whole_answer_matches_the_format_parse(format_name: str, text: str) -> None:
    call_format = get_format(format_name)
    stream = whole(format_name, text)
    parsed = [(c.name, dict(c.arguments)) for c in call_format.parse(text)]
    assert [(c.name, json.loads(c.arguments)) for c in stream.tool_calls] == parsed
    if not parsed:
        assert stream.content == text


def test_prose_is_content_and_wrappers_are_not() -> None:
    assert whole(*OUTPUTS[1]).content == "Sure {braces} here.\n"
    assert whole(*OUTPUTS[3]).content is None
    assert whole(*OUTPUTS[5]).content is None


def test_without_a_format_everything_is_content() -> None:
    stream = ToolCallStream(None, "t")
    assert stream.feed(OUTPUTS[0][1]).content == OUTPUTS[0][1]
    assert stream.finish().content == "" and stream.tool_calls == []
