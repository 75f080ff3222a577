"""Grouped tree attention: the stock SDPA numbers, without copying key/value heads."""

import random

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from transformers import AutoModelForCausalLM, Qwen2Config

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.core.draft_tree import DraftTree
from toolspec.model.attention import GROUPED_SDPA, STOCK_SDPA, use_grouped_tree_attention

VOCAB = 96


def _tree_logits(model, prompt: list[int], tree: DraftTree) -> torch.Tensor:
    target = TargetModel(model)
    cache = target.new_cache()
    target.prefill(cache, prompt)
    return target.forward_tree(cache, prompt[-1:], tree)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_tree_forward_matches_stock_sdpa(family: str) -> None:
    model = tiny_model(family, VOCAB)
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped heads
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(40)]
    tree = DraftTree.from_sequences([([5, 6, 7, 8], "a"), ([5, 9], "b"), ([10, 11, 12], "c")])
    assert model.config._attn_implementation == STOCK_SDPA
    stock = _tree_logits(model, prompt, tree)
    assert use_grouped_tree_attention(model)
    assert model.config._attn_implementation == GROUPED_SDPA
    grouped = _tree_logits(model, prompt, tree)
    torch.testing.assert_close(grouped, stock, rtol=1e-5, atol=1e-5)


def test_speculative_decoding_stays_lossless() -> None:
    stock = tiny_model("qwen2", VOCAB)
    grouped = tiny_model("qwen2", VOCAB)
    use_grouped_tree_attention(grouped)
    params = GenerationParams(max_new_tokens=30)
    for seed in range(3):
        prompt = [random.Random(seed).randrange(VOCAB) for _ in range(12)]
        plain = Engine(TargetModel(stock), ToyTokenizer(), budget=0, stop_token_ids=[]).generate(
            prompt, None, params)
        drafter = ScriptedDrafter(plain.tokens, VOCAB, seed)
        drafted = Engine(TargetModel(grouped), ToyTokenizer(), budget=12, stop_token_ids=[]
                         ).generate(prompt, drafter, params)
        assert drafted.tokens == plain.tokens
        assert any(step.accepted for step in drafted.steps)


def test_other_attention_implementations_are_left_alone() -> None:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    eager = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    assert not use_grouped_tree_attention(eager)
    assert eager.config._attn_implementation == "eager"


@pytest.mark.parametrize("prompt_length", [37, 130, 300, 600])
def test_a_prompt_prefilled_with_the_first_tree_caches_what_a_plain_prefill_caches(
        prompt_length: int) -> None:
    """Bitwise, in bf16: a near-tie later in the output must not depend on whether the first
    tree rode on the prefill."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    # head_dim 64 as the default model's: at 12 the stock kernel happens to agree anyway
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    use_grouped_tree_attention(model)
    target = TargetModel(model)
    rng = random.Random(prompt_length)
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_length)]
    tree = DraftTree.from_sequences([([5, 6, 7, 8], "a"), ([5, 9], "b"), ([10, 11, 12], "c")])
    plain, with_tree = target.new_cache(), target.new_cache()
    last = target.prefill(plain, prompt)
    logits = target.forward_tree(with_tree, prompt, tree)
    assert torch.equal(logits[0], last)
    for expected, got in zip(plain.layers, with_tree.layers, strict=True):
        assert torch.equal(got.keys[..., :prompt_length, :], expected.keys)
        assert torch.equal(got.values[..., :prompt_length, :], expected.values)
