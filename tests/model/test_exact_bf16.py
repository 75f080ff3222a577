"""Exact bf16: a generated token's logits do not depend on the forward it is
verified in, so speculative decoding reproduces plain decoding bitwise in bf16 too."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from torch import nn
from transformers import DynamicCache

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.core.draft_tree import DraftTree
from toolspec.core.forward import SequenceRows
from toolspec.model.loading import use_exact_bf16
from toolspec.model.packed_linear import EXACT_TILE_ROWS, PackedLinear, exact_tiles_available

VOCAB = 96
pytestmark = pytest.mark.skipif(not exact_tiles_available(torch.device("cpu"), torch.bfloat16),
                                reason="needs oneDNN's bf16 linear kernels")


def exact_model(family: str, seed: int = 0) -> TargetModel:
    model = tiny_model(family, VOCAB, seed=seed).to(torch.bfloat16)
    use_exact_bf16(model)
    return TargetModel(model)


def test_a_tiled_linear_gives_each_row_the_bits_of_a_one_row_call() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(40, 56).to(torch.bfloat16)
    tiled = PackedLinear(linear, tile_rows=EXACT_TILE_ROWS)
    rows = torch.randn(2 * EXACT_TILE_ROWS + 7, 40).to(torch.bfloat16)
    alone = torch.cat([tiled(row[None]) for row in rows])
    for count in (1, 2, 3, 17, EXACT_TILE_ROWS, EXACT_TILE_ROWS + 1, len(rows)):
        assert torch.equal(tiled(rows[:count]), alone[:count]), count
    assert torch.equal(tiled(rows.reshape(1, len(rows), 40))[0], alone)  # leading dims kept


def one_row_steps(model: TargetModel, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """Plain decoding's logits: the prompt's last row, then one row per token."""
    cache = model.new_cache()
    logits = [model.forward_tree(cache, prompt, DraftTree())[-1]]
    for token in tokens:
        logits.append(model.forward_tree(cache, [token], DraftTree())[-1])
    return logits


def test_tree_rows_are_bitwise_one_row_steps(tiny_family: str) -> None:
    model = exact_model(tiny_family)
    rng = random.Random(0)
    prompt = [rng.randrange(VOCAB) for _ in range(70)]
    tokens = [rng.randrange(VOCAB) for _ in range(12)]
    steps = one_row_steps(model, prompt, tokens)
    # A tree riding on the prompt's forward: the true chain plus a wrong sibling at each level.
    chains = [(tokens[:12], "truth"), *[(tokens[:depth] + [(tokens[depth] + 1) % VOCAB], "wrong")
                                        for depth in range(0, 12, 3)]]
    tree = DraftTree.from_sequences(chains)
    verified = model.forward_tree(model.new_cache(), prompt, tree)
    path = [0, *(node + 1 for node in tree.path_to(tree.leaves()[0]))]
    assert [tree.tokens[n - 1] for n in path[1:]] == tokens[:12]
    assert all(torch.equal(verified[row], steps[depth]) for depth, row in enumerate(path))
    # A decoding step's tree, after five tokens decoded one at a time.
    cache = model.new_cache()
    model.forward_tree(cache, prompt, DraftTree())
    for token in tokens[:4]:
        model.forward_tree(cache, [token], DraftTree())
    chain = DraftTree.from_sequences([(tokens[5:12], "truth")])
    verified = model.forward_tree(cache, tokens[4:5], chain)
    assert all(torch.equal(verified[i], steps[5 + i]) for i in range(len(chain) + 1))


def test_speculative_and_batched_decoding_reproduce_plain_decoding_in_bf16(
        tiny_family: str) -> None:
    model = exact_model(tiny_family, seed=3)
    engine = Engine(model, ToyTokenizer(), budget=12, stop_token_ids=[])
    rng = random.Random(2)
    params = GenerationParams(max_new_tokens=40)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 50))] for _ in range(5)]
    plain = [engine.generate(prompt, None, params).tokens for prompt in prompts]
    for seed, (prompt, truth) in enumerate(zip(prompts, plain)):
        speculative = engine.generate(prompt, ScriptedDrafter(truth, VOCAB, seed), params)
        assert speculative.tokens == truth, seed
        assert speculative.mat > 1.5
    jobs = [engine.start(p, ScriptedDrafter(t, VOCAB, 9), params) for p, t in zip(prompts, plain)]
    assert [g.tokens for g in engine.run(jobs)] == plain


def assert_rows_are_one_row_steps(model: TargetModel, prompt: list[int], tokens: list[int],
                                  other_prompt: list[int], vocab: int) -> None:
    """Verification forwards of 1..64 rows, and one forward holding a prompt, a chain and a
    branching tree of three requests: every row's logits are its one-row step's, bitwise."""
    assert len(tokens) >= 64
    steps = one_row_steps(model, prompt, tokens)  # steps[i]: after the prompt and tokens[:i]

    def decoded(count: int) -> DynamicCache:
        cache = model.new_cache()
        model.prefill(cache, prompt)
        for token in tokens[:count]:
            model.forward_tree(cache, [token], DraftTree())
        return cache

    for rows in range(1, 65):
        chain = DraftTree.from_sequences([(tokens[1:rows], "truth")]) if rows > 1 else DraftTree()
        verified = model.forward_tree(decoded(0), tokens[:1], chain)
        assert len(verified) == rows
        assert all(torch.equal(verified[i], steps[1 + i]) for i in range(rows)), rows
    alone = model.prefill(model.new_cache(), other_prompt)
    branching = DraftTree.from_sequences([(tokens[1:9], "truth"),
                                          ([tokens[1], (tokens[2] + 1) % vocab], "wrong"),
                                          ([(tokens[1] + 1) % vocab], "wrong")])
    truth_rows = [0, *(node + 1 for node in branching.path_to(branching.leaves()[0]))]
    assert [branching.tokens[row - 1] for row in truth_rows[1:]] == tokens[1:9]
    prompt_logits, chain_logits, tree_logits = model.forward([
        SequenceRows(model.new_cache(), tuple(other_prompt)),
        SequenceRows(decoded(3), (tokens[3],), DraftTree.from_sequences([(tokens[4:14], "truth")])),
        SequenceRows(decoded(0), (tokens[0],), branching)])
    assert torch.equal(prompt_logits[-1], alone)
    assert all(torch.equal(chain_logits[i], steps[4 + i]) for i in range(11))
    assert all(torch.equal(tree_logits[row], steps[1 + depth])
               for depth, row in enumerate(truth_rows))


def test_every_row_count_to_64_and_a_mixed_batch_give_each_row_its_one_row_bits(
        tiny_family: str) -> None:
    rng = random.Random(5)
    assert_rows_are_one_row_steps(exact_model(tiny_family, seed=5),
                                  [rng.randrange(VOCAB) for _ in range(20)],
                                  [rng.randrange(VOCAB) for _ in range(64)],
                                  [rng.randrange(VOCAB) for _ in range(33)], VOCAB)


@pytest.mark.real_model
def test_smollm2_rows_of_trees_and_mixed_batches_are_bitwise_one_row_steps() -> None:
    from toolspec.model.loading import load_model

    loaded = load_model("smollm2-135m", "bf16", exact_bf16=True)
    assert loaded.exact_bf16
    model = TargetModel(loaded.model)
    rng = random.Random(1)
    prompt = [rng.randrange(100, 20000) for _ in range(90)]
    tokens: list[int] = []
    cache = model.new_cache()
    logits = model.forward_tree(cache, prompt, DraftTree())[-1]
    for _ in range(15):  # greedy: the tokens plain decoding writes
        tokens.append(int(logits.argmax()))
        logits = model.forward_tree(cache, tokens[-1:], DraftTree())[-1]
    steps = one_row_steps(model, prompt, tokens)
    tree = DraftTree.from_sequences([(tokens, "truth")])
    verified = model.forward_tree(model.new_cache(), prompt, tree)
    assert all(torch.equal(verified[i], steps[i]) for i in range(len(tokens) + 1))
    assert_rows_are_one_row_steps(model, prompt, [rng.randrange(100, 20000) for _ in range(64)],
                                  [rng.randrange(100, 20000) for _ in range(41)], model.vocab_size)
