"""A request's output is read once: decoded incrementally to the text a whole decode gives,
parsed by one scanner, and that one parse is what the drafter, the stop checks, the library
and the response stream all read."""

from __future__ import annotations

import random

import pytest
from helpers import ToyTokenizer, tiny_model

from toolspec.calls.formats import get_format
from toolspec.calls.output import IncrementalDetokenizer, OutputParse, RequestOutput
from toolspec.calls.tools import ToolSet
from toolspec.core.drafter import DraftRequest, NoDrafter
from toolspec.core.engine import Engine, GenerationParams
from toolspec.core.stopping import StopScanner
from toolspec.model.packages import load_tokenizer
from toolspec.model.target_model import TargetModel

TEXTS = [
    'Sure! <tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
    "日本語のテキスト, emoji 🌦️🙂 and accents: é, ß, ø — done.",
    '```json\n[{"name": "a", "arguments": {"x": "\\u00e9"}}]\n```',
]


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2-135m"])
def tokenizer(request: pytest.FixtureRequest):
    return load_tokenizer(request.param)


def test_incremental_text_is_the_whole_decode(tokenizer) -> None:
    rng = random.Random(0)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        ids += [tokenizer.eos_token_id]  # a special token is no text
        noise = [rng.randrange(tokenizer.vocab_size) for _ in range(40)]  # cut characters too
        for sequence in (ids, noise):
            detokenizer = IncrementalDetokenizer(tokenizer)
            pieces = [detokenizer.append(token) for token in sequence]
            assert "".join(pieces) == detokenizer.text
            assert "\ufffd" not in detokenizer.text or "\ufffd" in tokenizer.decode(
                sequence[: len(sequence) - 1], skip_special_tokens=True)
            detokenizer.flush()
            assert detokenizer.text == tokenizer.decode(sequence, skip_special_tokens=True,
                                                        clean_up_tokenization_spaces=False)


def test_a_half_character_waits_for_its_rest(tokenizer) -> None:
    ids = tokenizer.encode("🦜", add_special_tokens=False)
    assert len(ids) > 1  # byte-level tokens of one character
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.append(token) for token in ids]
    assert pieces == [""] * (len(ids) - 1) + ["🦜"]


@pytest.mark.parametrize("format_name", ["hermes", "json"])
def test_the_parse_finds_the_calls_the_format_parses(format_name: str) -> None:
    call_format = get_format(format_name)
    text = TEXTS[0] if format_name == "hermes" else TEXTS[2]
    for cut in range(1, len(text)):
        parse = OutputParse(call_format)
        parse.feed(text[:cut])
        parse.feed(text[cut:])
        assert parse.text == text
        assert list(parse.calls()) == call_format.parse(text)
        assert [span.name for span in parse.spans] == [c.name for c in call_format.parse(text)]
        span = parse.spans[0]
        assert span.done and span.arguments(text).startswith("{")


def test_calls_past_a_stop_cut_are_not_the_outputs() -> None:
    text = TEXTS[0] + "\n<tool_call>\n" + TEXTS[0].split("\n", 1)[1]
    parse = OutputParse(get_format("hermes"))
    parse.feed(text)
    assert len(parse.calls()) == 2
    assert len(parse.calls(within=len(TEXTS[0]))) == 1


def test_stop_scanner_appends_up_to_the_ending_token() -> None:
    tokenizer = load_tokenizer("qwen2.5-coder-0.5b")
    ids = tokenizer.encode("alpha beta STOP gamma", add_special_tokens=False)
    output = RequestOutput(tokenizer, None)
    decision = StopScanner(frozenset(), ("STOP",), 100).append(output, ids)
    assert decision is not None and decision.stop_string == "STOP"
    assert output.tokens == ids[: decision.keep] and "gamma" not in output.text
    output = RequestOutput(tokenizer, None)
    decision = StopScanner(frozenset(), (), 3).append(output, ids)
    assert decision.reason == "length" and len(output.tokens) == 3


def test_drafter_and_job_share_one_parse(tiny_engine_parts) -> None:
    """The engine's job and the request's drafter read the same ``RequestOutput``: one
    scanner per request, fed once per emitted token."""
    model, tokenizer, drafter = tiny_engine_parts
    engine = Engine(model, tokenizer, budget=4)
    tools = ToolSet.from_openai([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}])
    job = engine.start([1, 2, 3], drafter, GenerationParams(max_new_tokens=6), tools=tools,
                       call_format=get_format("hermes"))
    assert drafter.started.output is job.output
    engine.run([job])
    assert drafter.started.output.tokens == list(job.generated)


class RecordingDrafter(NoDrafter):
    """Proposes nothing; records the request it was started with."""

    name = "recording"

    def __init__(self) -> None:
        self.started: DraftRequest | None = None

    def start(self, request: DraftRequest) -> None:
        self.started = request


@pytest.fixture
def tiny_engine_parts():
    return TargetModel(tiny_model("qwen2")), ToyTokenizer(), RecordingDrafter()
