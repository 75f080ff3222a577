"""The prefix cache: prompt blocks shared by a tenant's requests, taken instead of
computed — exactly: in fp32 a request served from a partly cached prompt gives bitwise the
logits, keys and output of a cold prefill, alone or batched, however its prompt was chunked;
tenants never share a block; a full cache evicts, never fails a request, never holds more than
its budget (not even while it copies); a block that cannot be kept is logged and the requests
go on; a kept block is a copy of its rows."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, SamplingParams, TargetModel
from toolspec.core.drafter import NoDrafter
from toolspec.core.prefix_cache import PrefixCache, block_keys
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.model.loading import use_exact_bf16
from toolspec.model.packed_linear import (
    exact_tiles_available,
    pack_linear_layers,
    packing_available,
)

VOCAB = 96
BLOCK = 8
bitwise = pytest.mark.skipif(not packing_available(torch.device("cpu"), torch.float32),
                             reason="bitwise fp32 needs oneDNN's prepacked linears")


def packed_model(family: str, seed: int = 0, block: int = BLOCK) -> TargetModel:
    model = tiny_model(family, VOCAB, seed=seed)
    pack_linear_layers(model)
    return TargetModel(model, block_tokens=block)


def cached_engine(model: TargetModel, budget_bytes: int = 1 << 30, step_rows: int = 0,
                  draft_budget: int = 10) -> Engine:
    cache = PrefixCache(model, budget_bytes, model.block_tokens)
    return Engine(model, ToyTokenizer(), budget=draft_budget, stop_token_ids=[3],
                  step_rows=step_rows, prefix_cache=cache)


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(4, VOCAB) for _ in range(count)]


# ---- the index ------------------------------------------------------------------------------

class ToyStore:
    """A block store over plain lists: a "cache" is a list of rows. Counts the bytes its
    stored blocks hold, and the most they ever held."""

    def __init__(self) -> None:
        self.dropped: list[tuple[int, ...]] = []
        self.held = self.peak = 0

    def save_block(self, cache: list, start: int, end: int) -> tuple[int, ...]:
        self.held += 100
        self.peak = max(self.peak, self.held)
        return tuple(cache[start:end])

    def saved_bytes(self, cache: list, start: int, end: int) -> int:
        return 100

    def load_blocks(self, cache: list, blocks: Sequence[tuple[int, ...]]) -> None:
        for block in blocks:
            cache.extend(block)

    def drop_block(self, block: tuple[int, ...]) -> None:
        self.held -= 100
        self.dropped.append(block)

    def block_bytes(self, block: tuple[int, ...]) -> int:
        return 100


def test_block_keys_chain_over_the_tenant_and_every_token_before() -> None:
    prompt = list(range(40))
    keys = block_keys("acme", prompt, 8)
    assert len(keys) == 5 and len(set(keys)) == 5
    assert block_keys("acme", prompt[:17], 8) == keys[:2]  # a partial block has no key
    assert block_keys("other", prompt, 8)[0] != keys[0]  # tenants never share a key
    changed = [*prompt[:3], 99, *prompt[4:]]
    assert all(a != b for a, b in zip(block_keys("acme", changed, 8), keys))  # chained


def test_a_prompt_takes_the_longest_chain_of_cached_blocks() -> None:
    store = ToyStore()
    cache = PrefixCache(store, budget_bytes=10_000, block_tokens=4)
    first = list(range(20))
    keys = block_keys("t", first, 4)
    assert cache.insert(first, keys, first, 0, 3) == 3  # blocks 0..2 (rows 0..12)
    second = [*first[:10], 77, *first[11:]]  # shares blocks 0 and 1, not 2
    second_keys = block_keys("t", second, 4)
    assert cache.cached_blocks(second_keys, second, 0, 5) == 2
    rows: list[int] = []
    cache.take(rows, second_keys, second, 0, 2)
    assert rows == first[:8]
    assert cache.cached_blocks(keys, first, 1, 2) == 1  # stops at the limit
    assert cache.cached_blocks(block_keys("u", first, 4), first, 0, 5) == 0  # another tenant
    assert cache.stats().hit_blocks == 2 and cache.stats().inserted_blocks == 3


def test_least_recently_used_leaves_go_first_under_the_byte_budget() -> None:
    store = ToyStore()
    cache = PrefixCache(store, budget_bytes=500, block_tokens=2)  # five blocks of 100 bytes
    shared = [1, 2, 3, 4]
    a, b = [*shared, 5, 6, 7, 8], [*shared, 9, 10, 11, 12]
    keys_a, keys_b = block_keys("t", a, 2), block_keys("t", b, 2)
    cache.insert(a, keys_a, a, 0, 4)
    cache.insert(b, keys_b, b, 0, 4)  # 6 blocks > 5: a's deepest block goes
    assert cache.stats().bytes <= 500 and cache.stats().evicted_blocks == 1
    assert store.dropped == [(7, 8)]
    assert cache.cached_blocks(keys_a, a, 0, 4) == 3  # the shared parents stay
    assert cache.cached_blocks(keys_b, b, 0, 4) == 4
    rows: list[int] = []
    cache.take(rows, keys_a, a, 0, 3)  # a is used again: b's leaves are now older
    cache.insert(a, keys_a, a, 0, 4)
    assert store.dropped[-1] == (11, 12)
    assert cache.cached_blocks(keys_a, a, 0, 4) == 4


def test_a_budget_below_one_block_caches_nothing() -> None:
    store = ToyStore()
    cache = PrefixCache(store, budget_bytes=50, block_tokens=2)
    prompt = [1, 2, 3, 4]
    cache.insert(prompt, block_keys("t", prompt, 2), prompt, 0, 2)
    assert len(cache) == 0 and cache.stats().bytes == 0 and store.peak == 0  # nothing copied


def test_an_insert_past_the_budget_never_holds_more_than_the_budget() -> None:
    store = ToyStore()
    cache = PrefixCache(store, budget_bytes=500, block_tokens=2)  # five blocks of 100 bytes
    other = [50, 51, 52, 53]
    cache.insert(other, block_keys("t", other, 2), other, 0, 2)
    prompt = list(range(20))  # ten blocks: twice the budget
    keys = block_keys("t", prompt, 2)
    assert cache.insert(prompt, keys, prompt, 0, 10) == 5
    assert store.peak <= 500  # every block made room before it was copied
    assert cache.cached_blocks(keys, prompt, 0, 10) == 5  # the prompt's first five blocks
    assert store.dropped == [(52, 53), (50, 51)]  # the other prompt's, deepest first


class FailingStore:
    """The model's block store, whose copies fail (a copy out of memory)."""

    def __init__(self, model: TargetModel) -> None:
        self.model = model

    def save_block(self, cache: object, start: int, end: int) -> object:
        raise torch.OutOfMemoryError("no memory for a copy of the block")

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)


def test_a_failed_insert_is_logged_and_every_request_is_served(
        caplog: pytest.LogCaptureFixture) -> None:
    model = TargetModel(tiny_model("qwen2", VOCAB), block_tokens=BLOCK)
    failing = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3],
                     prefix_cache=PrefixCache(FailingStore(model), 1 << 30, BLOCK))
    plain = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3])
    rng = random.Random(4)
    prompts = [tokens(rng, 3 * BLOCK + 2) for _ in range(3)]
    params = GenerationParams(max_new_tokens=6)
    with caplog.at_level("ERROR", logger="toolspec.core.engine"):
        served = failing.run([failing.start(prompt, None, params) for prompt in prompts])
    assert [generation.tokens for generation in served] == \
        [plain.generate(prompt, None, params).tokens for prompt in prompts]
    assert len(failing.prefix_cache) == 0 and failing.prefix_cache.stats().bytes == 0
    assert "prefix cache: keeping 3 prompt blocks failed" in caplog.text


def test_a_kept_block_is_a_copy_of_its_rows_not_a_view() -> None:
    model = TargetModel(tiny_model("llama", VOCAB), block_tokens=BLOCK)
    cache = model.new_cache()
    model.prefill(cache, tokens(random.Random(3), 3 * BLOCK))
    block = model.save_block(cache, BLOCK, 2 * BLOCK)
    kept = [(keys.clone(), values.clone()) for keys, values in block.layers]
    assert block.nbytes == model.saved_bytes(cache, BLOCK, 2 * BLOCK)
    for (keys, values), layer in zip(block.layers, cache.layers):
        for stored, source in ((keys, layer.keys), (values, layer.values)):
            assert stored.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
            assert stored.untyped_storage().nbytes() == stored.numel() * stored.element_size()
            with torch.inference_mode():  # the request's cache changes: the block does not
                source.zero_()
    assert all(torch.equal(keys, old_keys) and torch.equal(values, old_values)
               for (keys, values), (old_keys, old_values) in zip(block.layers, kept))


# ---- exactness ------------------------------------------------------------------------------

@bitwise
@pytest.mark.parametrize("cached_blocks", [0, 1, 3, 6])
def test_a_partly_cached_prompt_gives_a_cold_prefills_logits_and_keys(
        tiny_family: str, cached_blocks: int) -> None:
    model = packed_model(tiny_family, seed=1)
    rng = random.Random(cached_blocks)
    prompt = tokens(rng, 7 * BLOCK + 5)
    cold = model.new_cache()
    cold_logits = model.prefill(cold, prompt)
    # Another request with the same start filled the cache, in chunks of its own.
    other = [*prompt[: cached_blocks * BLOCK], *tokens(rng, 11)]
    cache = PrefixCache(model, 1 << 30, BLOCK)
    warm = model.new_cache()
    for start in range(0, len(other), 2 * BLOCK):
        model.prefill(warm, other[start: start + 2 * BLOCK])
    keys = block_keys("t", other, BLOCK)
    cache.insert(warm, keys, other, 0, len(keys))
    served = model.new_cache()
    prompt_keys = block_keys("t", prompt, BLOCK)
    assert cache.cached_blocks(prompt_keys, prompt, 0, 99) == cached_blocks
    cache.take(served, prompt_keys, prompt, 0, cached_blocks)
    rest = prompt[cached_blocks * BLOCK:]
    if len(rest) > 2 * BLOCK:  # a chunk of whole blocks first, as the engine cuts them
        model.prefill(served, rest[:2 * BLOCK])
        rest = rest[2 * BLOCK:]
    served_logits = model.prefill(served, rest)
    assert torch.equal(served_logits, cold_logits)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(served.layers, cold.layers))


@bitwise
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=5)])
def test_requests_served_from_the_cache_decode_as_cold_ones_alone_and_batched(
        tiny_family: str, sampling: SamplingParams) -> None:
    model = packed_model(tiny_family, seed=2)
    rng = random.Random(7)
    system = tokens(rng, 5 * BLOCK + 3)  # a shared system prompt and tools, then a question
    prompts = [[*system, *tokens(rng, rng.randint(2, 20))] for _ in range(6)]
    params = GenerationParams(max_new_tokens=30, sampling=sampling)
    cold = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3])
    truth = [cold.generate(prompt, None, params) for prompt in prompts]
    engine = cached_engine(model, step_rows=3 * BLOCK)
    # One alone first fills the cache; the rest run together, with drafts, chunked.
    first = engine.generate(prompts[0], None, params)
    assert first.tokens == truth[0].tokens and first.cached_tokens == 0
    drafters = [NoDrafter(), PromptLookupDrafter(),
                *(ScriptedDrafter(g.tokens, VOCAB, seed=i) for i, g in enumerate(truth[2:]))]
    jobs = [engine.start(prompt, drafter, params) for prompt, drafter in zip(prompts[1:], drafters)]
    together = engine.run(jobs)
    for one, many in zip(truth[1:], together):
        assert many.tokens == one.tokens
        assert many.cached_tokens == 5 * BLOCK  # the system prompt's whole blocks
    # The same prompt again: every block but the one holding its last token.
    again = engine.generate(prompts[3], None, params)
    assert again.tokens == truth[3].tokens
    assert again.cached_tokens == (len(prompts[3]) - 1) // BLOCK * BLOCK


@bitwise
def test_the_next_turn_of_a_conversation_is_a_prefix_hit() -> None:
    model = packed_model("qwen2", seed=4)
    engine = cached_engine(model)
    rng = random.Random(3)
    params = GenerationParams(max_new_tokens=12)
    turn = tokens(rng, 4 * BLOCK + 6)
    previous: list[int] = []
    for _ in range(3):
        generation = engine.generate(turn, PromptLookupDrafter(), params)
        cold = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3]).generate(
            turn, PromptLookupDrafter(), params)
        assert generation.tokens == cold.tokens
        # The earlier turn's whole prompt blocks (its answer's rows came from decoding).
        assert generation.cached_tokens == len(previous) // BLOCK * BLOCK
        previous = turn
        turn = [*turn, *generation.tokens, *tokens(rng, 9)]  # the answer, then a new message


def test_tenants_never_share_a_block() -> None:
    model = TargetModel(tiny_model("llama", VOCAB), block_tokens=BLOCK)
    engine = cached_engine(model)
    prompt = tokens(random.Random(1), 6 * BLOCK)
    params = GenerationParams(max_new_tokens=4)
    assert engine.generate(prompt, None, params, tenant="a").cached_tokens == 0
    assert engine.generate(prompt, None, params, tenant="b").cached_tokens == 0
    assert engine.generate(prompt, None, params, tenant="a").cached_tokens == 5 * BLOCK


def test_a_request_waits_one_step_for_the_blocks_another_computes_now() -> None:
    model = TargetModel(tiny_model("qwen2", VOCAB), block_tokens=BLOCK)
    engine = cached_engine(model, step_rows=4 * BLOCK)
    rng = random.Random(6)
    system = tokens(rng, 6 * BLOCK)
    params = GenerationParams(max_new_tokens=5)
    jobs = [engine.start([*system, *tokens(rng, 5)], None, params) for _ in range(3)]
    computed = 0
    while not all(job.done for job in jobs):
        report = engine.step([job for job in jobs if not job.done]).report
        computed += report.prompt_rows if report is not None else 0
    # The shared blocks were computed once; the others took them from the cache.
    assert sorted(job.cached_tokens for job in jobs) == [0, 6 * BLOCK, 6 * BLOCK]
    assert computed < 6 * BLOCK + 3 * 5 + BLOCK


def test_a_full_cache_evicts_and_never_fails_a_request() -> None:
    model = TargetModel(tiny_model("qwen2", VOCAB), block_tokens=BLOCK)
    engine = cached_engine(model, budget_bytes=1)  # smaller than one block
    plain = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3])
    rng = random.Random(2)
    params = GenerationParams(max_new_tokens=6)
    for _ in range(3):
        prompt = tokens(rng, 5 * BLOCK)
        assert engine.generate(prompt, None, params).tokens == \
            plain.generate(prompt, None, params).tokens
    assert len(engine.prefix_cache) == 0
    small = cached_engine(model, budget_bytes=4 * _block_bytes(model))
    for _ in range(4):
        small.generate(tokens(rng, 6 * BLOCK), None, params)
    stats = small.prefix_cache.stats()
    assert stats.bytes <= stats.budget_bytes and stats.evicted_blocks > 0


def test_hits_and_misses_are_counted_per_block() -> None:
    model = TargetModel(tiny_model("qwen2", VOCAB), block_tokens=BLOCK)
    engine = cached_engine(model)
    prompt = tokens(random.Random(9), 4 * BLOCK + 1)
    params = GenerationParams(max_new_tokens=3)
    engine.generate(prompt, None, params)
    engine.generate(prompt, None, params)
    stats = engine.prefix_cache.stats()
    assert (stats.missed_blocks, stats.hit_blocks, stats.inserted_blocks) == (4, 4, 4)
    assert stats.hit_rate == 0.5


def _block_bytes(model: TargetModel) -> int:
    cache = model.new_cache()
    model.prefill(cache, list(range(4, 4 + BLOCK)))
    return model.save_block(cache, 0, BLOCK).nbytes


@pytest.mark.skipif(not exact_tiles_available(torch.device("cpu"), torch.bfloat16),
                    reason="needs oneDNN's bf16 linear kernels")
def test_exact_bf16_outputs_stay_plain_decodings_with_the_cache_on(tiny_family: str) -> None:
    model = tiny_model(tiny_family, VOCAB, seed=5).to(torch.bfloat16)
    use_exact_bf16(model)
    target = TargetModel(model, block_tokens=BLOCK)
    rng = random.Random(4)
    system = tokens(rng, 4 * BLOCK + 2)
    prompts = [[*system, *tokens(rng, rng.randint(3, 15))] for _ in range(5)]
    params = GenerationParams(max_new_tokens=24)
    plain = Engine(target, ToyTokenizer(), budget=10, stop_token_ids=[3])
    truth = [plain.generate(prompt, None, params).tokens for prompt in prompts]
    engine = cached_engine(target, step_rows=3 * BLOCK)
    assert engine.generate(prompts[0], None, params).tokens == truth[0]
    jobs = [engine.start(prompt, ScriptedDrafter(want, VOCAB, seed=i), params)
            for i, (prompt, want) in enumerate(zip(prompts[1:], truth[1:]))]
    together = engine.run(jobs)
    assert [g.tokens for g in together] == truth[1:]
    assert all(g.cached_tokens == 4 * BLOCK for g in together)


@bitwise
@pytest.mark.real_model
def test_smollm2_served_from_cached_blocks_computes_a_cold_prefills_bits() -> None:
    from toolspec.calls.prompts import chat_prompt
    from toolspec.model.loading import load_model

    loaded = load_model("smollm2-135m", "fp32")  # prepacked linears
    model = TargetModel(loaded.model)
    system = {"role": "system", "content": "You answer questions about the weather, briefly. "
                                            "Call tools when you need data. " * 6}
    prompts = [chat_prompt(loaded.tokenizer, [system, {"role": "user", "content": question}])[0]
               for question in ("Is it raining in Oslo?", "Will it snow in Bergen tomorrow?")]
    cache = PrefixCache(model, 1 << 30, model.block_tokens)
    engine = Engine(model, loaded.tokenizer, budget=8, prefix_cache=cache)
    params = GenerationParams(max_new_tokens=16)
    for prompt in prompts:
        cold_cache = model.new_cache()
        cold_logits = model.prefill(cold_cache, prompt)
        keys = block_keys("default", prompt, model.block_tokens)
        held = cache.cached_blocks(keys, prompt, 0, (len(prompt) - 1) // model.block_tokens)
        served = model.new_cache()
        cache.take(served, keys, prompt, 0, held)
        assert torch.equal(model.prefill(served, prompt[held * model.block_tokens:]),
                           cold_logits)
        generation = engine.generate(prompt, PromptLookupDrafter(), params)
        assert generation.tokens == Engine(model, loaded.tokenizer, budget=8).generate(
            prompt, None, params).tokens
    assert cache.stats().hit_blocks > 0  # the second question took the system prompt's blocks


def test_a_new_size_drops_what_no_longer_fits_through_the_store() -> None:
    """Issue 51, item 5: a replica's prefix cache resized (``user_config``) keeps its blocks
    where they fit and drops the rest through its store — a tensor-parallel store drops them
    on every rank — and at 0 drops them all; nothing stays held that nobody indexes."""
    from deployments.replica.engine import EngineSettings
    from deployments.replica.toolspec_engine import resized_prefix_cache

    store = ToyStore()
    cache = PrefixCache(store, budget_bytes=500, block_tokens=2)
    for first in range(5):
        prompt = [first * 10 + i for i in range(3)]
        cache.insert(prompt, block_keys("t", prompt, 2), prompt, 0, 1)
    assert cache.stats().blocks == 5 and store.held == 500
    assert resized_prefix_cache(cache, None, EngineSettings(prefix_cache_bytes=200)) is cache
    assert cache.stats().blocks == 2 and store.held == 200 and len(store.dropped) == 3
    assert resized_prefix_cache(cache, None, EngineSettings(prefix_cache_bytes=0)) is None
    assert store.held == 0 and len(store.dropped) == 5
