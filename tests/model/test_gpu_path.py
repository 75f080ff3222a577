"""The accelerator subset (``-m gpu``): the decode loop on the device ``TOOLSPEC_TEST_DEVICE``
names (default ``cpu``; ``scripts/gpu_check.py`` runs these on ``cuda``). Lossless greedy and
seeded sampling, batched decoding equal to each request alone, grammar masks applied on the
logits' device, and requests served from the prefix cache equal to cold ones — every tensor
the loop makes must live where the model does."""

from __future__ import annotations

import os
import random

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model, toy_fast_tokenizer

from toolspec.calls.formats import get_format
from toolspec.calls.tool_grammar import tool_call_grammar
from toolspec.calls.tools import ToolSet
from toolspec.core.engine import Engine, GenerationParams
from toolspec.core.grammar_masks import GrammarCompiler
from toolspec.core.prefix_cache import PrefixCache
from toolspec.core.sampling import SamplingParams
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.model.target_model import TargetModel

pytestmark = pytest.mark.gpu
VOCAB = 96


@pytest.fixture(scope="module")
def device() -> torch.device:
    name = os.environ.get("TOOLSPEC_TEST_DEVICE", "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.fail(f"TOOLSPEC_TEST_DEVICE={name} but CUDA is not available here")
    return torch.device(name)


def engine_on(device: torch.device, budget: int = 10, block: int = 8,
              cache: bool = False) -> Engine:
    model = TargetModel(tiny_model("qwen2", VOCAB).to(device), block_tokens=block)
    prefix = PrefixCache(model, 1 << 28, block) if cache else None
    return Engine(model, ToyTokenizer(), budget=budget, stop_token_ids=[3], prefix_cache=prefix)


def prompt(rng: random.Random, count: int = 12) -> list[int]:
    return [rng.randrange(4, VOCAB) for _ in range(count)] * 2


def test_the_model_and_what_the_loop_makes_live_on_the_device(device: torch.device) -> None:
    engine = engine_on(device)
    assert engine.model.device.type == device.type
    generation = engine.generate(prompt(random.Random(1)), PromptLookupDrafter(),
                                 GenerationParams(max_new_tokens=16))
    assert len(generation.tokens) > 0


def test_greedy_speculation_is_lossless_on_the_device(device: torch.device) -> None:
    engine = engine_on(device)
    rng = random.Random(2)
    for _ in range(3):
        ids = prompt(rng)
        params = GenerationParams(max_new_tokens=24)
        plain = engine.generate(ids, None, params)
        assert engine.generate(ids, PromptLookupDrafter(), params).tokens == plain.tokens
        assert engine.generate(ids, ScriptedDrafter(plain.tokens, VOCAB, 0), params
                               ).tokens == plain.tokens


def test_seeded_sampling_replays_plain_sampling_on_the_device(device: torch.device) -> None:
    engine = engine_on(device)
    with torch.no_grad():
        engine.model.model.lm_head.weight.mul_(0.05)  # high entropy: the draws matter
    rng = random.Random(3)
    for seed in range(3):
        ids = prompt(rng)
        params = GenerationParams(max_new_tokens=24, sampling=SamplingParams(
            temperature=0.9, top_p=0.95, top_k=40, seed=seed))
        plain = engine.generate(ids, None, params)
        assert engine.generate(ids, ScriptedDrafter(plain.tokens, VOCAB, seed), params
                               ).tokens == plain.tokens


def test_a_batch_decodes_as_each_request_alone_on_the_device(device: torch.device) -> None:
    engine = engine_on(device)
    rng = random.Random(4)
    prompts = [prompt(rng, rng.randint(5, 14)) for _ in range(4)]
    params = GenerationParams(max_new_tokens=20)
    alone = [engine.generate(ids, PromptLookupDrafter(), params).tokens for ids in prompts]
    jobs = [engine.start(ids, PromptLookupDrafter(), params) for ids in prompts]
    together = engine.run(jobs)
    assert [generation.tokens for generation in together] == alone


def test_grammar_masks_apply_on_the_logits_device(device: torch.device) -> None:
    tokenizer = toy_fast_tokenizer()
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    tools = ToolSet.from_functions([{"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 8}}}}])
    grammar = tool_call_grammar(tools.tools, get_format("hermes"), "calls", False,
                                compiler.added_tokens)
    model = TargetModel(tiny_model("qwen2", vocab_size=len(tokenizer), seed=3).to(device))
    engine = Engine(model, tokenizer, budget=8, stop_token_ids=[tokenizer.eos_token_id])
    generation = engine.generate([5, 9, 11, 7], params=GenerationParams(
        max_new_tokens=120, constraint=compiler.compile(grammar)))
    [call] = get_format("hermes").parse(generation.text)
    assert call.name == "get_weather" and set(call.arguments) == {"city"}


def test_a_prompt_from_the_prefix_cache_decodes_as_a_cold_one_on_the_device(
        device: torch.device) -> None:
    cached, cold = engine_on(device, cache=True), engine_on(device)
    rng = random.Random(5)
    system = [rng.randrange(4, VOCAB) for _ in range(40)]
    params = GenerationParams(max_new_tokens=16)
    for turn in range(3):
        ids = [*system, *(rng.randrange(4, VOCAB) for _ in range(6))]
        served = cached.generate(ids, PromptLookupDrafter(), params)
        assert served.tokens == cold.generate(ids, None, params).tokens
        assert served.cached_tokens == (0 if turn == 0 else 40)
