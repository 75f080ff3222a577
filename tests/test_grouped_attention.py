"""Grouped tree attention: the stock SDPA numbers, without copying key/value heads."""

import random

import pytest
import torch
from transformers import Qwen2Config

from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from toolspec import Engine, GenerationParams, TargetModel
from toolspec.draft_tree import DraftTree
from toolspec.grouped_attention import GROUPED_SDPA, STOCK_SDPA, use_grouped_tree_attention

VOCAB = 96


def _tree_logits(model, prompt: list[int], tree: DraftTree) -> torch.Tensor:
    target = TargetModel(model)
    cache = target.new_cache()
    target.prefill(cache, prompt)
    return target.forward_tree(cache, prompt[-1], tree)


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
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    assert not use_grouped_tree_attention(eager)
    assert eager.config._attn_implementation == "eager"
