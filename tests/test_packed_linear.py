"""Prepacked linear weights: same products as ``nn.Linear``, rows independent, decoding lossless."""

import argparse
import random

import pytest
import torch
from torch import nn

from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from toolspec import Engine, GenerationParams, TargetModel
from toolspec.cli import _packed_rows
from toolspec.packed_linear import (STOCK_KERNEL_MAX_ROWS, PackedLinear, pack_linear_layers,
                                    packing_available)

needs_mkl = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                               reason="packed weights need a CPU build of torch with MKL")
VOCAB = 96


def _linear(bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(48, 80, bias=bias).eval()


@needs_mkl
@pytest.mark.parametrize("bias", [True, False])
def test_every_row_count_gives_the_stock_product(bias: bool) -> None:
    linear = _linear(bias)
    packed = PackedLinear(linear, (8, 16))
    for rows in range(1, 21):  # stock sizes, both packs with padding, and past the largest
        inputs = torch.randn(1, rows, 48)
        with torch.no_grad():
            torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
            assert packed(inputs).shape == (1, rows, 80)


@needs_mkl
def test_a_packed_row_does_not_depend_on_the_other_rows() -> None:
    packed = PackedLinear(_linear(True), (8, 16))
    for rows in range(STOCK_KERNEL_MAX_ROWS + 1, 17):
        first = torch.randn(rows, 48)
        second = torch.randn(rows, 48)
        second[0] = first[0]
        with torch.no_grad():
            assert torch.equal(packed(first)[0], packed(second)[0]), rows


def test_pack_sizes_must_be_above_the_stock_sizes() -> None:
    with pytest.raises(ValueError, match="above"):
        PackedLinear(_linear(True), (STOCK_KERNEL_MAX_ROWS,))
    with pytest.raises(argparse.ArgumentTypeError):
        _packed_rows("2,8")
    with pytest.raises(argparse.ArgumentTypeError):
        _packed_rows("eight")
    assert _packed_rows("16, 8") == (8, 16)
    assert _packed_rows("none") == ()


@needs_mkl
def test_packing_keeps_parameters_and_tied_weights(tiny_family: str) -> None:
    model = tiny_model(tiny_family, VOCAB)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    keys = set(model.state_dict())
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linear_layers(model, (8,)) == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert set(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight


@needs_mkl
def test_speculative_decoding_on_packed_weights_equals_plain_decoding(tiny_family: str) -> None:
    stock = Engine(TargetModel(tiny_model(tiny_family, VOCAB)), ToyTokenizer(), budget=12,
                   stop_token_ids=[])
    packed_model = tiny_model(tiny_family, VOCAB)
    pack_linear_layers(packed_model, (8, 16))
    packed = Engine(TargetModel(packed_model), ToyTokenizer(), budget=12, stop_token_ids=[])
    rng = random.Random(0)
    params = GenerationParams(max_new_tokens=40)
    for seed in range(8):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        plain = stock.generate(prompt, None, params)
        # Plain decoding never reaches a packed size, so it runs the stock kernels unchanged.
        assert packed.generate(prompt, None, params).tokens == plain.tokens
        drafter = ScriptedDrafter(plain.tokens, VOCAB, seed)
        assert packed.generate(prompt, drafter, params).tokens == plain.tokens, f"seed {seed}"
