import pytest
import torch
from scipy.stats import chisquare

from toolspec.core.sampling import SamplingParams, TokenChooser, draw, target_distribution


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0])
    probs = target_distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs[0] == 0 and probs[3] == 0
    assert torch.allclose(probs[1:3], torch.softmax(torch.tensor([4.0, 3.0]), -1))


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = target_distribution(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([0.0, 1.0])
    probs = target_distribution(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(torch.tensor([0.0, 2.0]), -1))


def test_draw_follows_the_distribution_and_never_picks_zero_mass() -> None:
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    for _ in range(6000):
        counts[draw(probs, generator)] += 1
    assert counts[[0, 2, 5]].sum() == 0
    kept = [1, 3, 4]
    assert chisquare(counts[kept].numpy(), (probs[kept] * 6000).numpy()).pvalue > 1e-3


def test_greedy_chooser_takes_argmax_per_row() -> None:
    chooser = TokenChooser(SamplingParams())
    chooser.bind(torch.tensor([[0.0, 2.0, 1.0], [5.0, 1.0, 0.0]]))
    assert [chooser.choose(0), chooser.choose(1)] == [1, 0]


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 0.0}, {"top_k": -1}])
def test_bad_sampling_params_are_rejected(kwargs) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
