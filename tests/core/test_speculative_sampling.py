"""Speculative sampling is distribution-exact, and with a fixed seed it replays plain sampling."""

import random
from collections import Counter

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model
from scipy.stats import chisquare

from toolspec import DraftTree, Engine, GenerationParams, SamplingParams, TargetModel
from toolspec.core.sampling import TokenChooser, target_distribution
from toolspec.core.verify import walk_tree
from toolspec.drafting.prompt_lookup import PromptLookupDrafter

VOCAB = 8
DRAWS = 24_000


def exact_first_two(model: TargetModel, context: list[int], params: SamplingParams) -> torch.Tensor:
    """P(e1, e2) under plain sampling, from sequential forwards: p(e1 | ctx) p(e2 | ctx, e1)."""
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    cache = model.new_cache()
    first = target_distribution(model.prefill(cache, context), params).double()
    for e1 in range(VOCAB):
        branch = model.new_cache()
        model.prefill(branch, context)
        second = target_distribution(model.prefill(branch, [e1]), params).double()
        joint[e1] = first[e1] * second
    return joint


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0, seed=7),
     SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=8)],
    ids=["plain", "truncated"],
)
def test_first_two_tokens_follow_the_plain_sampling_distribution(params: SamplingParams) -> None:
    model = TargetModel(tiny_model("qwen2", vocab_size=VOCAB, seed=3))
    with torch.no_grad():  # soften the toy model so many cells carry mass
        model.model.lm_head.weight.mul_(0.1)
    prompt, root = [1, 5, 2, 6], 3
    # Half the first tokens land in the tree, half force a second forward.
    tree = DraftTree.from_sequences([([a, b], "toy") for a in range(4) for b in range(4)])
    cache = model.new_cache()
    model.prefill(cache, prompt)
    tree_logits = model.forward_tree(cache, [root], tree)
    after_bonus = {}
    for e1 in range(VOCAB):
        branch = model.new_cache()
        model.prefill(branch, prompt + [root])
        after_bonus[e1] = model.prefill(branch, [e1])[None]

    chooser = TokenChooser(params)
    counts: Counter[tuple[int, int]] = Counter()
    for _ in range(DRAWS):
        chooser.bind(tree_logits)
        path = walk_tree(tree, chooser)
        emitted = [tree.tokens[n] for n in path.nodes] + [path.bonus]
        if len(emitted) == 1:  # off the tree: the next step's root row decides e2
            chooser.bind(after_bonus[emitted[0]])
            emitted.append(chooser.choose(0))
        counts[emitted[0], emitted[1]] += 1

    exact = exact_first_two(model, prompt + [root], params).flatten()
    observed = torch.tensor([counts[divmod(i, VOCAB)] for i in range(VOCAB * VOCAB)],
                            dtype=torch.float64)
    assert observed[exact == 0].sum() == 0, "sampled a token outside top-k/top-p"
    # Pool rare cells so every chi-square bucket expects at least 5 draws.
    expected = exact * DRAWS
    rare = (expected > 0) & (expected < 5)
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[rare].sum()[None]])
    exp = torch.cat([expected[keep], expected[rare].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert keep.sum() >= 20, "the toy distribution should spread over many cells"
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    in_tree = sum(c for (e1, _), c in counts.items() if e1 < 4)
    assert 0.1 < in_tree / DRAWS < 0.9, "both the in-tree and the off-tree path must be exercised"


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_seeded_speculative_sampling_replays_plain_sampling(family: str) -> None:
    vocab = 96
    engine = Engine(TargetModel(tiny_model(family, vocab)), ToyTokenizer(), budget=10,
                    stop_token_ids=[])
    with torch.no_grad():
        engine.model.model.lm_head.weight.mul_(0.05)  # high-entropy: sampling matters
    rng = random.Random(0)
    for seed in range(6):
        prompt = [rng.randrange(vocab) for _ in range(12)] * 2
        params = GenerationParams(
            max_new_tokens=32,
            sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=seed),
        )
        plain = engine.generate(prompt, None, params)
        scripted = engine.generate(prompt, ScriptedDrafter(plain.tokens, vocab, seed), params)
        lookup = engine.generate(prompt, PromptLookupDrafter(), params)
        assert scripted.tokens == plain.tokens == lookup.tokens
        assert scripted.mat > 1.0
