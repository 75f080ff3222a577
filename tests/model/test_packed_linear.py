"""Prepacked linear weights: same products as ``nn.Linear``, rows independent, decoding lossless."""

import random

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from torch import nn

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.main import build_parser
from toolspec.model.packed_linear import PackedLinear, pack_linear_layers, packing_available

needs_onednn = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                                  reason="packed weights need a CPU build of torch with oneDNN")
VOCAB = 96


def _linear(bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(48, 80, bias=bias).eval()


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_every_row_count_gives_the_stock_product(bias: bool) -> None:
    linear = _linear(bias)
    packed = PackedLinear(linear)
    for rows in (*range(1, 21), 64, 65, 300):  # decoding steps, trees, prefills
        inputs = torch.randn(1, rows, 48)
        with torch.no_grad():
            torch.testing.assert_close(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
            assert packed(inputs).shape == (1, rows, 80)


@needs_onednn
def test_a_row_does_not_depend_on_the_other_rows() -> None:
    """What makes a draft node's logits those of a one-row step: the same bits, whatever the
    number of rows in the call."""
    packed = PackedLinear(_linear(True))
    inputs = torch.randn(300, 48)
    with torch.no_grad():
        alone = packed(inputs[:1])[0]
        for rows in (*range(2, 21), 33, 64, 65, 129, 300):
            assert torch.equal(packed(inputs[:rows])[0], alone), rows
            assert torch.equal(packed(inputs[rows - 1: rows])[0], packed(inputs[:rows])[-1]), rows


def test_the_command_line_switches_packing_off() -> None:
    parse = build_parser().parse_args
    assert parse(["bench", "--data", "x"]).prepack_linear
    assert not parse(["bench", "--data", "x", "--no-prepack-linear"]).prepack_linear


@needs_onednn
def test_packing_keeps_parameters_and_tied_weights(tiny_family: str) -> None:
    model = tiny_model(tiny_family, VOCAB)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    keys = set(model.state_dict())
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert pack_linear_layers(model) == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert set(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight


@needs_onednn
def test_speculative_decoding_on_packed_weights_equals_plain_decoding(tiny_family: str) -> None:
    packed_model = tiny_model(tiny_family, VOCAB)
    pack_linear_layers(packed_model)
    packed = Engine(TargetModel(packed_model), ToyTokenizer(), budget=12, stop_token_ids=[])
    rng = random.Random(0)
    params = GenerationParams(max_new_tokens=40)
    for seed in range(8):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        plain = packed.generate(prompt, None, params)
        drafter = ScriptedDrafter(plain.tokens, VOCAB, seed)
        assert packed.generate(prompt, drafter, params).tokens == plain.tokens, f"seed {seed}"
