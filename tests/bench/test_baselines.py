"""The model-free baselines (samd, recycling, suffix): lossless, within budget, no leaks."""

import random
from collections.abc import Sequence

import pytest
import torch
from helpers import ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.baselines.recycling import TokenRecyclingDrafter
from toolspec.bench.baselines.samd import SamDecodingDrafter
from toolspec.bench.methods import METHODS, MethodSetup
from toolspec.bench.observers import logits_observer, observers_for
from toolspec.bench.sim import SimTarget, simulate
from toolspec.core.budget import FixedBudget
from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.core.sampling import SamplingParams
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.suffix_decoding import SuffixDecodingDrafter, SuffixOutputCache

VOCAB = 96
BASELINES = ("samd", "recycling", "suffix")


def baseline(name: str) -> Drafter:
    """The drafter the benchmark would use for a run (one per run: it learns across items)."""
    return METHODS[name](MethodSetup(tokenizer=ToyTokenizer()))(())


@pytest.fixture(params=BASELINES)
def method(request: pytest.FixtureRequest) -> str:
    return request.param


Runs = tuple[Engine, GenerationParams, list[tuple[list[int], tuple[int, ...]]]]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def greedy_runs(request: pytest.FixtureRequest) -> Runs:
    """Plain decoding's outputs on repetitive prompts, computed once for all methods."""
    engine = Engine(TargetModel(tiny_model(request.param, VOCAB)), ToyTokenizer(), budget=12,
                    stop_token_ids=[])
    params = GenerationParams(max_new_tokens=32)
    rng = random.Random(7)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 20))] * 2 for _ in range(3)]
    return engine, params, [(p, engine.generate(p, None, params).tokens) for p in prompts]


@pytest.fixture(scope="module")
def sampled_runs() -> Runs:
    """Plain seeded sampling on a high-entropy model, computed once for all methods."""
    engine = Engine(TargetModel(tiny_model("qwen2", VOCAB)), ToyTokenizer(), budget=10,
                    stop_token_ids=[])
    with torch.no_grad():
        engine.model.model.lm_head.weight.mul_(0.05)  # high entropy: sampling matters
    params = GenerationParams(max_new_tokens=30, sampling=SamplingParams(
        temperature=0.9, top_p=0.95, top_k=40, seed=3))
    rng = random.Random(8)
    prompts = [[rng.randrange(VOCAB) for _ in range(10)] * 2 for _ in range(2)]
    return engine, params, [(p, engine.generate(p, None, params).tokens) for p in prompts]


def test_baselines_are_lossless_greedy(greedy_runs: Runs, method: str) -> None:
    engine, params, runs = greedy_runs
    drafter = baseline(method)
    accepted = 0
    for prompt, plain in runs:
        speculative = engine.generate(prompt, drafter, params,
                                      observers=observers_for(drafter))
        assert speculative.tokens == plain
        accepted += sum(speculative.accepted_by_source().values())
    assert accepted > 0


def test_baselines_replay_seeded_sampling(sampled_runs: Runs, method: str) -> None:
    engine, params, runs = sampled_runs
    drafter = baseline(method)
    for prompt, plain in runs:
        assert engine.generate(prompt, drafter, params,
                               observers=observers_for(drafter)).tokens == plain


def test_engine_feeds_top_k_candidates_of_every_verified_row() -> None:
    class Recorder(TokenRecyclingDrafter):
        def __init__(self) -> None:
            super().__init__()
            self.fed: list[tuple[tuple[int, ...], list[list[int]]]] = []
            self.proposed: list[DraftTree] = []
            self.emitted: list[list[int]] = []

        def propose(self, context: Sequence[int], budget: int) -> DraftTree:
            self.proposed.append(super().propose(context, budget))
            return self.proposed[-1]

        def observe_logits(self, tokens: Sequence[int], top_k_ids: Sequence[Sequence[int]]) -> None:
            self.fed.append((tuple(tokens), [list(ids) for ids in top_k_ids]))
            super().observe_logits(tokens, top_k_ids)

        def observe(self, emitted: Sequence[int]) -> None:
            self.emitted.append(list(emitted))
            super().observe(emitted)

    engine = Engine(TargetModel(tiny_model("qwen2", VOCAB)), ToyTokenizer(), budget=8,
                    stop_token_ids=[])
    recorder = Recorder()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 2
    generation = engine.generate(prompt, recorder, GenerationParams(max_new_tokens=30),
                                 observers=observers_for(recorder))
    assert len(recorder.fed) == len(generation.steps) + 1  # the prefill's forward, then each step
    context = list(prompt)
    for (tokens, top_k), tree, emitted in zip(recorder.fed, recorder.proposed, recorder.emitted,
                                              strict=True):
        assert tokens == (context[-1], *tree.tokens)  # the root, then every node, rejected too
        assert len(top_k) == len(tokens) and all(len(set(row)) == 8 for row in top_k)
        assert top_k[0][0] == emitted[0]  # greedy: the root row's best is what came next
        context.extend(emitted)
    assert generation.mat > 1.0


def test_only_drafters_that_want_candidates_get_them() -> None:
    assert logits_observer(PromptLookupDrafter()) is None
    assert logits_observer(SuffixDecodingDrafter()) is None
    assert logits_observer(SamDecodingDrafter(recycling_fallback=False)) is None
    assert logits_observer(SamDecodingDrafter()) is not None
    assert logits_observer(TokenRecyclingDrafter()) is not None


def test_drafts_never_exceed_the_budget(method: str) -> None:
    rng = random.Random(9)
    drafter = baseline(method)
    for _ in range(3):
        context = [rng.randrange(6) for _ in range(40)]
        drafter.start(DraftRequest(tuple(context)))
        for _ in range(30):
            budget = rng.randrange(0, 20)
            tree = drafter.propose(context, budget)
            assert len(tree) <= budget
            emitted = [rng.randrange(6) for _ in range(rng.randint(1, 4))]
            context.extend(emitted)
            drafter.observe(emitted)
        drafter.stop()


def test_cross_request_learning_never_sees_the_current_item(method: str) -> None:
    # Prompt and output share no token and no output token repeats: within its own item nothing
    # can be predicted, so any accepted draft on the first item would be a leak. The same item
    # again must then be drafted from what was learned after the first one finished.
    prompt, output = tuple(range(20)), tuple(range(40, 70))
    target = SimTarget("item", prompt, output, DraftRequest(prompt))
    drafter = METHODS[method](MethodSetup(tokenizer=ToyTokenizer()))(output)  # ar tokens ignored
    first = simulate(drafter, [target], FixedBudget(16), ToyTokenizer())
    assert first.mat == 1.0
    second = simulate(drafter, [target], FixedBudget(16), ToyTokenizer())
    assert second.mat > 4.0


def test_samd_drafts_the_match_and_falls_back_below_the_threshold() -> None:
    drafter = SamDecodingDrafter(n_predicts=4, len_threshold=3, recycling_fallback=False)
    drafter.start(DraftRequest((1, 2, 3, 4, 5, 6, 7, 8, 1, 2)))
    assert drafter.propose([], 16).tokens == ()  # a 2-token match is below the threshold
    drafter.observe([3])
    tree = drafter.propose([], 16)
    assert tree.tokens == (4, 5, 6, 7) and set(tree.sources) == {"samd"}
    assert drafter.propose([], 2).tokens == (4, 5)
    drafter.stop()
    # The finished output is now in the static corpus, drafted after a 4-token discount.
    drafter.start(DraftRequest((9, 9)))
    drafter.observe([3])
    assert drafter.propose([], 16).tokens == ()


def test_suffix_drafts_by_frequency_and_evicts_old_outputs() -> None:
    drafter = SuffixDecodingDrafter(max_cached_requests=2, min_token_prob=0.2)
    for output in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        drafter.start(DraftRequest((0,)))
        drafter.observe(output)
        drafter.stop()
    # Cached: [1, 2, 3] and [1, 2, 4] (the oldest was evicted): after "1 2", 3 and 4 are even.
    drafter.start(DraftRequest((7, 1, 2)))
    tree = drafter.propose([7, 1, 2], 8)
    assert sorted(tree.tokens) == [3, 4] and tree.priors == (0.5, 0.5)
    assert drafter.global_trie.counts()[(1, 2)] == 2


def test_suffix_drafts_after_a_context_not_yet_emitted_without_changing() -> None:
    """``propose_after`` reads only the context it is given: after a hypothetical continuation
    (a draft's leaf) it drafts what the request's own text says follows there, and the
    drafter's next real proposal is what it would have been."""
    from toolspec.core.drafter import ContextDrafter, context_drafter

    drafter = SuffixDecodingDrafter()
    assert context_drafter(drafter) is drafter and isinstance(drafter, ContextDrafter)
    assert context_drafter(PromptLookupDrafter()) is None  # drafts from its own copy
    drafter.start(DraftRequest((4, 5, 6, 7, 8, 1)))
    drafter.observe([2])
    before = drafter.propose([4, 5, 6, 7, 8, 1, 2], 8)
    assert drafter.propose_after([4, 5, 6, 7, 8, 1, 2, 4, 5], 2).tokens == (6, 7)
    assert drafter.propose([4, 5, 6, 7, 8, 1, 2], 8) == before


def test_suffix_drafters_sharing_a_cache_learn_from_each_other() -> None:
    cache = SuffixOutputCache()
    first, second = SuffixDecodingDrafter(cache=cache), SuffixDecodingDrafter(cache=cache)
    first.start(DraftRequest((0,)))
    second.start(DraftRequest((0,)))
    first.observe([5, 6, 7, 8])
    assert second.propose([5, 6], 8).tokens == ()  # not before the first request finishes
    first.stop()
    assert second.propose([5, 6], 8).tokens == (7, 8)
    learner_off = SuffixDecodingDrafter(cache=cache, learn=False)
    learner_off.start(DraftRequest((0,)))
    learner_off.observe([1, 2, 3])
    learner_off.stop()
    assert (1, 2) not in cache.trie.counts()
