"""Batched verification: many sequences' rows in one ragged forward give each sequence exactly
what it gets alone (fp32 with prepacked linear layers: bitwise), so batched decoding is plain
decoding's output for every request; one request's failure is its own."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, SamplingParams, TargetModel
from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import DraftRequest, NoDrafter
from toolspec.core.forward import SequenceRows
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.model.packed_linear import pack_linear_layers, packing_available

VOCAB = 96
pytestmark = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                                reason="bitwise batching needs oneDNN's prepacked fp32 linears")


def packed_model(family: str, seed: int = 0) -> TargetModel:
    model = tiny_model(family, VOCAB, seed=seed)
    pack_linear_layers(model)
    return TargetModel(model)


def random_rows(model: TargetModel, rng: random.Random, kind: str) -> SequenceRows:
    """A sequence as a batch meets it: a fresh prompt (with or without a first tree), a later
    prompt chunk, a decoding step, or a verification step."""
    cache = model.new_cache()
    if kind != "prompt":
        model.prefill(cache, [rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))])
    tree = DraftTree.from_sequences(
        ([rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))], "t") for _ in range(3))
    if kind == "prompt":
        return SequenceRows(cache, tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))),
                            tree if rng.random() < 0.5 else DraftTree())
    if kind == "chunk":
        return SequenceRows(cache, tuple(rng.randrange(VOCAB) for _ in range(rng.randint(2, 20))),
                            logits=rng.random() < 0.5)
    if kind == "decode":
        return SequenceRows(cache, (rng.randrange(VOCAB),))
    return SequenceRows(cache, (rng.randrange(VOCAB),), tree)


def alone(model: TargetModel, rows: SequenceRows) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``rows`` run by themselves on a copy of their cache: logits and the cache's keys."""
    copied = SequenceRows(copy.deepcopy(rows.cache), rows.pending, rows.tree, rows.logits)
    logits = model.forward([copied])[0]
    return logits, [layer.keys for layer in copied.cache.layers]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_batched_logits_and_caches_are_bitwise_each_sequence_alone(tiny_family: str,
                                                                  size: int) -> None:
    model = packed_model(tiny_family)
    rng = random.Random(size)
    for trial in range(3):
        batch = [random_rows(model, rng, rng.choice(["prompt", "chunk", "decode", "tree"]))
                 for _ in range(size)]
        expected = [alone(model, rows) for rows in batch]
        got = model.forward(batch)
        for rows, logits, (want_logits, want_keys) in zip(batch, got, expected):
            assert (logits is None) == (want_logits is None) == (not rows.logits)
            if logits is not None:
                assert torch.equal(logits, want_logits)
            assert all(torch.equal(layer.keys, keys)
                       for layer, keys in zip(rows.cache.layers, want_keys))


def engine_for(model: TargetModel, step_rows: int = 0) -> Engine:
    return Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3], step_rows=step_rows)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(rng.randint(4, 60))] for _ in range(count)]


def run_together(engine: Engine, items: Sequence[list[int]], drafters: Sequence,
                 params: GenerationParams, step_rows: int | None = None) -> list:
    jobs = [engine.start(prompt, drafter, params) for prompt, drafter in zip(items, drafters)]
    return engine.run(jobs, step_rows)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=4)])
def test_eight_concurrent_requests_decode_exactly_as_each_alone(tiny_family: str,
                                                                sampling: SamplingParams) -> None:
    model = packed_model(tiny_family, seed=2)
    model.block_tokens = 8
    engine = engine_for(model, step_rows=16)
    params = GenerationParams(max_new_tokens=40, sampling=sampling)
    items = prompts(8, seed=3)
    plain = [engine.generate(prompt, None, params) for prompt in items]
    mixed = [NoDrafter() if i % 3 == 0 else PromptLookupDrafter() if i % 3 == 1
             else ScriptedDrafter(plain[i].tokens, VOCAB, seed=i) for i in range(8)]
    together = run_together(engine, items, mixed, params, step_rows=40)
    for one, many in zip(plain, together):
        assert many.tokens == one.tokens and many.finish_reason == one.finish_reason
    assert sum(len(g.steps) for g in together) < sum(len(g.steps) for g in plain)


def test_prompt_chunks_share_the_step_budget_and_decoding_goes_on_beside_them() -> None:
    model = packed_model("qwen2")
    model.block_tokens = 8
    engine = engine_for(model, step_rows=8)
    params = GenerationParams(max_new_tokens=6)
    long_job = engine.start(list(range(4, 70)), None, params)  # 66 rows: 8 blocks of 8, then 2
    short_job = engine.start([5, 6, 7], None, params)
    engine.step([short_job])  # it decodes: prompts beside it now come in chunks
    shorts_before_long_starts = 0
    while not long_job.done or not short_job.done:
        live = [job for job in (long_job, short_job) if not job.done]
        outcomes = engine.step(live, step_rows=12).outcomes
        if short_job in live and long_job.prefilling and outcomes[live.index(short_job)]:
            shorts_before_long_starts += bool(outcomes[live.index(short_job)].event.tokens)
    assert shorts_before_long_starts >= 5  # the short request decoded while the long prefilled


class BrokenDrafter(PromptLookupDrafter):
    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if len(context) > self.prompt_length + 3:
            raise RuntimeError("drafter bug")
        return super().propose(context, budget)

    def start(self, request: DraftRequest) -> None:
        super().start(request)
        self.prompt_length = len(request.prompt_ids)


def test_a_failing_request_fails_alone_and_the_batch_goes_on() -> None:
    model = packed_model("llama")
    engine = engine_for(model)
    params = GenerationParams(max_new_tokens=30)
    items = prompts(4, seed=9)
    plain = [engine.generate(prompt, None, params) for prompt in items]
    drafters = [PromptLookupDrafter(), BrokenDrafter(), NoDrafter(), PromptLookupDrafter()]
    results = run_together(engine, items, drafters, params)
    assert isinstance(results[1], RuntimeError)
    for index in (0, 2, 3):
        assert results[index].tokens == plain[index].tokens


@pytest.mark.real_model
def test_smollm2_batched_greedy_outputs_equal_each_alone() -> None:
    from toolspec.calls.prompts import chat_prompt
    from toolspec.model.loading import load_model
    loaded = load_model("smollm2-135m", "fp32")
    model = TargetModel(loaded.model)
    engine = Engine(model, loaded.tokenizer, budget=8, step_rows=32)
    texts = ["List three colours.", "Repeat: {\"name\": \"get_weather\", \"city\": \"Paris\"}",
             "What is 2 + 2?", "Name a fruit.", "Write the word hello twice.",
             "Count from one to five.", "Say yes.", "Spell cat."]
    items = [chat_prompt(loaded.tokenizer, [{"role": "user", "content": text}])[0]
             for text in texts]
    params = GenerationParams(max_new_tokens=24)
    plain = [engine.generate(prompt, None, params) for prompt in items]
    together = run_together(engine, items, [PromptLookupDrafter() for _ in items], params,
                            step_rows=96)
    assert [g.tokens for g in together] == [g.tokens for g in plain]
