"""Grammar-constrained decoding: tool-call grammars, masked choice, and its composition with
speculation (speculative constrained output == plain constrained output, token for token)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from helpers import ScriptedDrafter, tiny_model, toy_fast_tokenizer

from toolspec.calls.formats import get_format
from toolspec.calls.tool_grammar import (
    UnconstrainableToolError,
    check_constrainable,
    closed_schema,
    tool_call_grammar,
)
from toolspec.calls.tools import ToolSet
from toolspec.core.drafter import NoDrafter
from toolspec.core.engine import Engine, GenerationParams
from toolspec.core.grammar_masks import GrammarCompiler
from toolspec.core.sampling import SamplingParams
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.schema import SchemaDrafter
from toolspec.model.target_model import TargetModel

TOOLS = ToolSet.from_functions([
    {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 12},
                       "unit": {"enum": ["celsius", "fahrenheit"]}}}},
    {"name": "add", "parameters": {
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 999},
                       "b": {"type": "boolean"},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                "maxItems": 2}}}},
])


@pytest.fixture(scope="module")
def tokenizer():
    return toy_fast_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


@pytest.fixture(scope="module")
def engine(tokenizer) -> Engine:
    model = TargetModel(tiny_model("qwen2", vocab_size=len(tokenizer), seed=3))
    return Engine(model, tokenizer, budget=12, stop_token_ids=[tokenizer.eos_token_id])


def constrained(compiler: GrammarCompiler, fmt: str = "hermes", shape: str = "calls",
                parallel: bool = False, tools: ToolSet = TOOLS, max_new_tokens: int = 120,
                sampling: SamplingParams = SamplingParams()) -> GenerationParams:
    lark = tool_call_grammar(tools.tools, get_format(fmt), shape, parallel, compiler.added_tokens)
    return GenerationParams(max_new_tokens=max_new_tokens, sampling=sampling,
                            constraint=compiler.compile(lark))


def prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(len(tokenizer) - 3) for _ in range(rng.randint(3, 12))]
            for _ in range(count)]


def assert_valid_calls(text: str, fmt: str, tools: ToolSet, at_most_one: bool) -> None:
    calls = get_format(fmt).parse(text)
    assert calls, f"no call parsed from {text!r}"
    assert not at_most_one or len(calls) == 1
    for call in calls:
        tool = tools.get(call.name)
        assert tool is not None, call.name
        jsonschema.validate(dict(call.arguments), tool.parameters)


def test_closed_schema_closes_declared_objects_only() -> None:
    schema = {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "free": {"type": "object"},
        "open": {"type": "object", "properties": {}, "additionalProperties": True}}}
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["inner"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["free"]
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # not mutated


def test_added_tokens_are_matched_by_id(compiler: GrammarCompiler, tokenizer) -> None:
    lark = tool_call_grammar(TOOLS.tools, get_format("hermes"), "calls", False,
                             compiler.added_tokens)
    assert f"<[{tokenizer.convert_tokens_to_ids('<tool_call>')}]>" in lark
    assert "<tool_call>" not in lark


def test_unsupported_schemas_are_refused_with_the_tool_named() -> None:
    bad = ToolSet.from_functions([{"name": "odd", "parameters": {
        "type": "object", "properties": {"when": {"type": "string", "format": "made-up"}}}}])
    with pytest.raises(UnconstrainableToolError, match="'odd'.*made-up"):
        check_constrainable(bad.tools)
    check_constrainable(TOOLS.tools)


def test_compiled_grammars_are_cached(tokenizer) -> None:
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id], capacity=2)
    first = constrained(compiler).constraint
    assert constrained(compiler).constraint is first
    constrained(compiler, fmt="json")
    constrained(compiler, fmt="apibank")  # evicts the least recently used (hermes)
    assert compiler.compiled == 3
    assert constrained(compiler).constraint is not first
    assert compiler.compiled == 4


@pytest.mark.parametrize("fmt, parallel", [("hermes", False), ("json", False),
                                           ("apibank", False), ("hermes", True)])
def test_constrained_calls_always_validate_on_a_random_model(engine, compiler, tokenizer, fmt,
                                                             parallel) -> None:
    """The tiny random model writes garbage unconstrained; masked, it writes valid calls. One
    call then ends with EOS; parallel calls may repeat until the length limit (a greedy random
    model loops), and every complete call is still valid."""
    call_format = get_format(fmt)
    for index, prompt in enumerate(prompts(tokenizer, 2, seed=len(fmt))):
        sampling = SamplingParams(temperature=1.0, seed=index) if index % 2 else SamplingParams()
        params = constrained(compiler, fmt, parallel=parallel, sampling=sampling,
                             max_new_tokens=160)
        generation = engine.generate(prompt, params=params)
        assert_valid_calls(generation.text, fmt, TOOLS, at_most_one=not parallel)
        if not parallel:
            assert generation.finish_reason == "stop", generation.text
            assert generation.tokens[-1] == tokenizer.eos_token_id
            closed = generation.text.rstrip(" \t\r\n")  # a little whitespace may trail
            assert closed.endswith("}") or closed.endswith(
                call_format.call_close + call_format.block_close)
    unconstrained = engine.generate(prompts(tokenizer, 1)[0], params=GenerationParams(40))
    assert not get_format(fmt).parse(unconstrained.text)


def test_named_choice_forces_that_tool(engine, compiler, tokenizer) -> None:
    named = ToolSet((TOOLS.get("add"),))
    for prompt in prompts(tokenizer, 2, seed=7):
        generation = engine.generate(prompt, params=constrained(compiler, tools=named,
                                                                max_new_tokens=160))
        assert generation.finish_reason == "stop", generation.text
        calls = get_format("hermes").parse(generation.text)
        assert [call.name for call in calls] == ["add"]
        jsonschema.validate(dict(calls[0].arguments), TOOLS.get("add").parameters)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=5)])
def test_speculative_constrained_decoding_equals_plain_constrained_decoding(
        engine, compiler, tokenizer, sampling) -> None:
    for fmt, parallel in (("hermes", True), ("json", False)):
        for index, prompt in enumerate(prompts(tokenizer, 2, seed=11)):
            params = constrained(compiler, fmt, parallel=parallel, sampling=sampling,
                                 max_new_tokens=100)
            plain = engine.generate(prompt, NoDrafter(), params)
            for drafter in (ScriptedDrafter(plain.tokens, len(tokenizer), seed=index),
                            SchemaDrafter(tokenizer, PromptLookupDrafter())):
                fast = engine.generate(prompt, drafter, params, tools=TOOLS,
                                       call_format=get_format(fmt))
                assert fast.tokens == plain.tokens
                assert fast.finish_reason == plain.finish_reason
            assert fast.mat >= 1.0


def test_scripted_drafts_of_the_masked_output_are_accepted_deeply(engine, compiler,
                                                                   tokenizer) -> None:
    prompt = prompts(tokenizer, 1, seed=3)[0]
    params = constrained(compiler, max_new_tokens=100)
    plain = engine.generate(prompt, NoDrafter(), params)
    fast = engine.generate(prompt, ScriptedDrafter(plain.tokens, len(tokenizer), seed=1),
                           params)
    assert fast.tokens == plain.tokens
    assert len(fast.steps) < len(plain.steps)


def test_text_or_calls_leaves_text_free_and_constrains_calls(compiler, tokenizer) -> None:
    for fmt in ("hermes", "json"):
        call_format = get_format(fmt)
        lark = tool_call_grammar(TOOLS.tools, call_format, "text_or_calls", False,
                                 compiler.added_tokens)
        constraint = compiler.compile(lark)
        text = tokenizer.encode("Just prose {with braces}.")
        matcher = constraint.matcher()
        assert matcher.try_consume_tokens(text) == len(text) and matcher.is_accepting()
        opening = call_format.block_open + call_format.call_open + '{"name": '
        bad = tokenizer.encode("Sure. " + opening + '"delete_all"')
        matcher = constraint.matcher()
        assert matcher.try_consume_tokens(bad) < len(bad)
        good = tokenizer.encode("Sure. " + opening + '"add", "arguments": {"a": 1, "b": true}}'
                                + call_format.call_close)
        matcher = constraint.matcher()
        assert matcher.try_consume_tokens(good) == len(good) and matcher.is_accepting()


def test_masks_cover_logits_wider_than_the_tokenizer(tokenizer) -> None:
    """Models pad their vocabulary; padded rows must never be chosen."""
    width = len(tokenizer) + 29
    compiler = GrammarCompiler(tokenizer, width, [tokenizer.eos_token_id])
    model = TargetModel(tiny_model("qwen2", vocab_size=width, seed=1))
    engine = Engine(model, tokenizer, budget=4, stop_token_ids=[tokenizer.eos_token_id])
    generation = engine.generate(prompts(tokenizer, 1)[0],
                                 params=constrained(compiler, max_new_tokens=160))
    assert max(generation.tokens) < len(tokenizer)
    assert_valid_calls(generation.text, "hermes", TOOLS, at_most_one=True)
    json.loads(next(line for line in generation.text.split("\n") if line.startswith("{")))


@pytest.mark.real_model
def test_real_model_required_call_is_valid_and_speculation_changes_nothing() -> None:
    """SmolLM2-135M (real weights, not a tool caller) under ``required``: a valid call, and
    the same tokens with schema drafting as without."""
    from toolspec.calls.prompts import chat_prompt
    from toolspec.model.loading import load_model

    loaded = load_model("smollm2-135m", "float32")
    model = TargetModel(loaded.model)
    engine = Engine(model, loaded.tokenizer, budget=8)
    width = model.model.get_output_embeddings().weight.shape[0]
    compiler = GrammarCompiler(loaded.tokenizer, width, engine.stop_token_ids)
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    prompt, call_format = chat_prompt(loaded.tokenizer, messages, [t.openai() for t in TOOLS])
    lark = tool_call_grammar(TOOLS.tools, call_format, "calls", False, compiler.added_tokens)
    params = GenerationParams(max_new_tokens=60, constraint=compiler.compile(lark))
    plain = engine.generate(prompt, NoDrafter(), params)
    fast = engine.generate(prompt, SchemaDrafter(loaded.tokenizer, PromptLookupDrafter()), params,
                           tools=TOOLS, call_format=call_format)
    assert fast.tokens == plain.tokens
    assert plain.finish_reason == "stop", plain.text
    assert_valid_calls(plain.text, call_format.name, TOOLS, at_most_one=True)


def accepts(compiler: GrammarCompiler, tokenizer, lark: str, text: str) -> tuple[bool, bool]:
    """Whether the grammar takes every token of ``text``, and then allows the end."""
    matcher = compiler.compile(lark).matcher()
    ids = tokenizer.encode(text)
    return matcher.try_consume_tokens(ids) == len(ids), matcher.is_accepting()


def test_forced_calls_may_be_bare_and_end_after_a_little_whitespace(compiler, tokenizer) -> None:
    """The model ends where it would end unconstrained: Qwen2.5 writes bare objects under
    auto, and "</tool_call>\\n" before its end token."""
    call = '{"name": "add", "arguments": {"a": 1, "b": true}}'
    for parallel in (False, True):
        lark = tool_call_grammar(TOOLS.tools, get_format("hermes"), "calls", parallel,
                                 compiler.added_tokens)
        assert accepts(compiler, tokenizer, lark, call) == (True, True)
        assert accepts(compiler, tokenizer, lark, f"<tool_call>\n{call}\n</tool_call>\n") \
            == (True, True)
        assert accepts(compiler, tokenizer, lark, f"<tool_call>\n{call}\n</tool_call>" + " " * 6
                       )[0] is False  # the whitespace is bounded
        assert accepts(compiler, tokenizer, lark, f"{call}\n{call}")[0] is parallel
    assert accepts(compiler, tokenizer, lark, f"Sure: {call}")[0] is False


def test_a_response_format_answer_follows_its_schema(compiler, tokenizer) -> None:
    from toolspec.calls.tool_grammar import answer_grammar
    schema = {"type": "object", "properties": {"t": {"type": "integer"}}, "required": ["t"]}
    lark = answer_grammar(schema)
    assert accepts(compiler, tokenizer, lark, '{\n  "t": 3\n}\n') == (True, True)
    assert accepts(compiler, tokenizer, lark, '{"u": 3}')[0] is False
    assert accepts(compiler, tokenizer, lark, '{"t": 3')[1] is False
    # With tools under auto: the answer or calls, nothing else.
    either = tool_call_grammar(TOOLS.tools, get_format("hermes"), "text_or_calls", True,
                               compiler.added_tokens, answer=schema)
    assert accepts(compiler, tokenizer, either, '{"t": 3}') == (True, True)
    call = '{"name": "add", "arguments": {"a": 1, "b": true}}'
    assert accepts(compiler, tokenizer, either, call) == (True, True)
    assert accepts(compiler, tokenizer, either, f"<tool_call>\n{call}\n</tool_call>") \
        == (True, True)
    assert accepts(compiler, tokenizer, either, "Sure.")[0] is False


def test_the_mask_is_applied_on_the_logits_device(compiler) -> None:
    """The grammar's mask is built on the CPU; it must meet the logits where they are (CUDA in
    production; ``meta`` here, which no CPU tensor can be mixed with)."""
    import torch
    chooser = constrained(compiler).constraint.chooser(SamplingParams(temperature=1.0, seed=0))
    chooser.bind(torch.zeros(2, compiler.vocab_size, device="meta"))
    masked = chooser.masked_logits(0)
    assert masked.device.type == "meta" and masked.shape == (compiler.vocab_size,)
