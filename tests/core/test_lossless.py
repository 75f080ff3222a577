"""Speculative decoding must reproduce plain decoding token for token (tiny models, fp32)."""

import random

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.baselines.oracle import OracleDrafter
from toolspec.bench.observers import MarginRecorder
from toolspec.drafting.prompt_lookup import PromptLookupDrafter

VOCAB = 96


@pytest.fixture
def engine(tiny_family: str) -> Engine:
    return Engine(TargetModel(tiny_model(tiny_family, VOCAB)), ToyTokenizer(), budget=12,
                  stop_token_ids=[])


def random_prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]


def test_random_trees_with_the_truth_at_random_depths_are_lossless(engine: Engine) -> None:
    rng = random.Random(0)
    params = GenerationParams(max_new_tokens=40)
    accepted_somewhere = False
    for seed in range(12):
        prompt = random_prompt(rng)
        plain = engine.generate(prompt, None, params)
        speculative = engine.generate(prompt, ScriptedDrafter(plain.tokens, VOCAB, seed), params)
        assert speculative.tokens == plain.tokens, f"seed {seed}"
        assert speculative.finish_reason == plain.finish_reason == "length"
        accepted_somewhere |= speculative.mat > 1.5
    assert accepted_somewhere


def test_prompt_lookup_is_lossless(engine: Engine) -> None:
    rng = random.Random(1)
    params = GenerationParams(max_new_tokens=48)
    for _ in range(6):
        prompt = random_prompt(rng) * 2  # repetition gives the lookup something to find
        assert engine.generate(prompt, PromptLookupDrafter(), params).tokens == \
            engine.generate(prompt, None, params).tokens


def test_oracle_reaches_the_depth_budget(engine: Engine) -> None:
    prompt = random_prompt(random.Random(2))
    params = GenerationParams(max_new_tokens=60)
    plain = engine.generate(prompt, None, params)
    oracle = engine.generate(prompt, OracleDrafter(plain.tokens), params)
    assert oracle.tokens == plain.tokens
    assert oracle.mat >= 0.9 * (engine.budget.max_nodes + 1)
    assert all(step.accepted == step.nodes for step in oracle.steps)
    assert oracle.accepted_by_source()["oracle"] == len(plain.tokens) - 1 - len(oracle.steps)


def test_stop_token_inside_a_multi_token_step_ends_where_plain_decoding_ends(tiny_family) -> None:
    model = TargetModel(tiny_model(tiny_family, VOCAB))
    prompt = random_prompt(random.Random(3))
    free = Engine(model, ToyTokenizer(), stop_token_ids=[]).generate(
        prompt, None, GenerationParams(max_new_tokens=30))
    stop_token = free.tokens[17]
    first = free.tokens.index(stop_token)
    engine = Engine(model, ToyTokenizer(), budget=12, stop_token_ids=[stop_token])
    params = GenerationParams(max_new_tokens=30)
    plain = engine.generate(prompt, None, params)
    oracle = engine.generate(prompt, OracleDrafter(free.tokens), params)
    assert plain.tokens == oracle.tokens == free.tokens[: first + 1]
    assert plain.finish_reason == oracle.finish_reason == "stop"


def test_stop_string_inside_a_multi_token_step(tiny_family) -> None:
    model = TargetModel(tiny_model(tiny_family, VOCAB))
    prompt = random_prompt(random.Random(4))
    engine = Engine(model, ToyTokenizer(), budget=12, stop_token_ids=[])
    free = engine.generate(prompt, None, GenerationParams(max_new_tokens=30))
    stop = f"<{free.tokens[12]}><{free.tokens[13]}>"
    params = GenerationParams(max_new_tokens=30, stop=(stop,))
    plain = engine.generate(prompt, None, params)
    oracle = engine.generate(prompt, OracleDrafter(free.tokens), params)
    assert plain.tokens == oracle.tokens
    assert plain.text == oracle.text and stop not in oracle.text
    assert len(oracle.tokens) <= 14 and oracle.finish_reason == "stop"


def test_max_new_tokens_is_exact(engine: Engine) -> None:
    prompt = random_prompt(random.Random(5))
    for limit in (1, 2, 7, 13):
        plain = engine.generate(prompt, None, GenerationParams(max_new_tokens=limit))
        oracle = engine.generate(prompt, OracleDrafter(plain.tokens + (0,) * 20),
                                 GenerationParams(max_new_tokens=limit))
        assert len(oracle.tokens) == limit and oracle.tokens == plain.tokens


def test_an_observer_outside_the_loop_records_a_margin_per_token(engine: Engine) -> None:
    prompt = random_prompt(random.Random(6))
    params = GenerationParams(max_new_tokens=20)
    plain_margins, oracle_margins = MarginRecorder(), MarginRecorder()
    plain = engine.generate(prompt, None, params, observers=(plain_margins,))
    engine.generate(prompt, OracleDrafter(plain.tokens), params, observers=(oracle_margins,))
    assert len(plain_margins.margins) == len(plain.tokens)
    assert oracle_margins.margins == pytest.approx(plain_margins.margins, abs=1e-4)
    assert min(plain_margins.margins) > 0


def test_plain_decoding_is_one_token_per_step(engine: Engine) -> None:
    plain = engine.generate([1, 2, 3], None, GenerationParams(max_new_tokens=10))
    assert plain.mat == 1.0 and len(plain.steps) == 9
    assert all(step.nodes == 0 for step in plain.steps)
    assert torch.is_tensor(torch.tensor(plain.tokens))
