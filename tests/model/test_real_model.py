"""Real weights (SmolLM2-135M, fp32): speculation reproduces plain decoding."""

import pytest

from toolspec import Engine, GenerationParams, SamplingParams, TargetModel
from toolspec.bench.baselines.oracle import OracleDrafter
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.model.loading import load_model

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that returns the sum of a list of numbers.",
    'Repeat this JSON exactly: {"name": "get_weather", "arguments": '
    '{"city": "Paris", "unit": "c"}}',
    "List the days of the week, one per line.",
]


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m", dtype="fp32")


def chat(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_prompt_lookup_is_identical_to_plain_decoding(smol) -> None:
    engine = Engine(TargetModel(smol.model), smol.tokenizer, budget=10)
    params = GenerationParams(max_new_tokens=48)
    speculated_steps = 0
    for text in PROMPTS:
        prompt = chat(smol.tokenizer, text)
        plain = engine.generate(prompt, None, params)
        lookup = engine.generate(prompt, PromptLookupDrafter(), params)
        oracle = engine.generate(prompt, OracleDrafter(plain.tokens), params)
        assert lookup.tokens == plain.tokens == oracle.tokens
        assert lookup.text == plain.text
        speculated_steps += sum(1 for s in lookup.steps if s.accepted)
        assert oracle.mat > 4
    assert speculated_steps > 0


def test_seeded_sampling_is_identical_to_plain_sampling(smol) -> None:
    engine = Engine(TargetModel(smol.model), smol.tokenizer, budget=10)
    prompt = chat(smol.tokenizer, PROMPTS[1])
    params = GenerationParams(max_new_tokens=40,
                              sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=11))
    plain = engine.generate(prompt, None, params)
    assert engine.generate(prompt, PromptLookupDrafter(), params).tokens == plain.tokens
