"""vLLM as the replica's engine, drafting with the ToolSpec proposer, on the default model's real
weights: outputs equal vLLM plain's, calls parsed and streamed, constrained requests, tenants
apart in the prefix cache and the library, a failing drafter and a dead engine."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from deployments.messages import ChatRequest
from deployments.replica.engine import EngineSettings
from toolspec.bench.datasets import load_dataset
from toolspec.calls.formats import ToolCall
from toolspec.calls.tools import ToolSet
from toolspec.library import CallLibrary

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

MODEL = "qwen2.5-coder-0.5b"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}]


def _settings(method: str) -> EngineSettings:
    # fp32: outputs compared with vLLM plain are exact, not near-tie flips of bf16 rounding.
    return EngineSettings(model=MODEL, dtype="fp32", engine="vllm", speculative_method=method,
                          speculative_tokens=16, kv_cache_gib=1.0, compile=False)


class _Loop:
    """One event loop on a thread of its own for the module: vLLM's async engine serves from
    the loop it first ran in (as a replica's engine does from the replica's loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def loop() -> Iterator[_Loop]:
    running = _Loop()
    yield running
    running.close()


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, object]]:
    from deployments.replica.vllm_engine import VLLMChatEngine

    # Both start at once: each start is mostly a fresh process importing vLLM on one core.
    with ThreadPoolExecutor(max_workers=2) as pool:
        starting = {method: pool.submit(VLLMChatEngine, _settings(method))
                    for method in ("toolspec", "none")}
    started = {method: future.result() for method, future in starting.items()
               if future.exception() is None}
    try:
        for future in starting.values():
            future.result()  # a start that failed fails the tests, after the others close
        yield started
    finally:
        with ThreadPoolExecutor(max_workers=2) as pool:  # each waits seconds for its processes
            list(pool.map(lambda engine: engine.close(), started.values()))


def _request(request_id: str, messages: list[dict], tools: list[dict] | None = None,
             tenant: str = "acme", **options: object) -> ChatRequest:
    return ChatRequest(request_id=request_id, model=MODEL, messages=tuple(messages),
                       tools=ToolSet.from_openai(tools) if tools else None,
                       openai_tools=tuple(tools or ()), max_tokens=options.pop("max_tokens", 96),
                       tenant=tenant, **options)


async def _run(engine, request: ChatRequest, library: CallLibrary | None = None):
    opened = engine.open(request, library)
    streamed = ""
    async for step in opened.steps:
        streamed += step.text
        if step.generation is not None:
            return step.generation, streamed
    raise AssertionError("no generation")


def _apibank(count: int, max_tokens: int = 64) -> list[ChatRequest]:
    items = load_dataset("apibank:level-1", limit=count, skip=200)  # never tuned on
    return [_request(item.id, list(item.messages), [tool.openai() for tool in item.tools],
                     max_tokens=max_tokens) for item in items]


def test_outputs_equal_vllm_plain_alone_and_batched(loop, engines) -> None:
    """The same requests through the ToolSpec proposer and through plain vLLM, one at a time
    and all at once: identical texts; the proposer's drafts were accepted."""
    requests = _apibank(4)

    async def both():
        alone = [await _run(engines["toolspec"], request) for request in requests]
        batched = await asyncio.gather(*(_run(engines["toolspec"], r) for r in requests))
        plain = await asyncio.gather(*(_run(engines["none"], r) for r in requests))
        return alone, batched, plain

    alone, batched, plain = loop.run(both())
    for (one, _), (many, _), (reference, _) in zip(alone, batched, plain):
        assert one.text == reference.text and many.text == reference.text
        assert one.tokens == reference.tokens
    assert sum(len(g.tokens) for g, _ in alone) / sum(
        len(g.verifications) + 1 for g, _ in alone) > 1.5  # tokens per forward, first included
    assert all(g.mat == 1.0 for g, _ in plain)


def test_calls_are_parsed_and_streamed_text_adds_up(loop, engines) -> None:
    request = _request("w1", [{"role": "user", "content": "What's the weather in Paris?"}],
                       WEATHER)
    generation, streamed = loop.run(_run(engines["toolspec"], request))
    assert generation.calls and generation.calls[0].name == "get_weather"
    assert generation.calls[0].arguments["city"] == "Paris"
    assert streamed == generation.text
    assert generation.finish_reason == "stop"


def test_a_required_call_decodes_under_its_grammar(loop, engines) -> None:
    request = _request("w2", [{"role": "user", "content": "Tell me a joke about Oslo."}],
                       WEATHER, tool_choice="required")
    generation, _ = loop.run(_run(engines["toolspec"], request))
    assert [call.name for call in generation.calls] == ["get_weather"]
    assert set(generation.calls[0].arguments) <= {"city", "unit"}


def test_one_tenants_prompt_blocks_and_calls_never_serve_another(loop, engines, tmp_path) -> None:
    """The prefix cache is salted per tenant: a repeated prompt is served from cache for its
    tenant only. Past calls ride with their tenant's requests only."""
    messages = [{"role": "user", "content": "What's the weather in Lisbon? " * 20}]
    engine = engines["toolspec"]

    async def three():
        first, _ = await _run(engine, _request("t1", messages, WEATHER, tenant="alpha"))
        again, _ = await _run(engine, _request("t2", messages, WEATHER, tenant="alpha"))
        other, _ = await _run(engine, _request("t3", messages, WEATHER, tenant="beta"))
        return first, again, other

    first, again, other = loop.run(three())
    assert first.cached_tokens == 0 and other.cached_tokens == 0
    assert again.cached_tokens >= 128
    with CallLibrary(tmp_path / "library") as library:
        library.add(ToolCall("get_weather", {"city": "Zanzibar-7731"}), tenant="alpha")
        params = engine.sampling_params(_request("t4", messages, WEATHER, tenant="beta"),
                                _plan(engine, "beta", messages), library)
        assert "Zanzibar" not in str(params.extra_args)
        params = engine.sampling_params(_request("t5", messages, WEATHER, tenant="alpha"),
                                _plan(engine, "alpha", messages), library)
        assert "Zanzibar-7731" in str(params.extra_args)


def _plan(engine, tenant: str, messages: list[dict]):
    return engine.plan(_request("p", messages, WEATHER, tenant=tenant))


def test_a_request_whose_drafting_fails_decodes_without_drafts(loop, engines) -> None:
    """A request carrying drafting data the proposer cannot use (an unknown method) gets no
    drafts; it and the requests beside it still answer exactly as plain vLLM."""
    from toolspec.vllm.request import EXTRA_ARGS_KEY

    engine = engines["toolspec"]
    requests = _apibank(2, max_tokens=32)
    broken = requests[0]
    plan = engine.plan(broken)
    params = engine.sampling_params(broken, plan, None)
    params.extra_args[EXTRA_ARGS_KEY]["method"] = "no-such-method"

    async def run():
        failed = engine._steps(broken, plan, params)
        texts = await asyncio.gather(_collect(failed), *(_run(engine, r) for r in requests[1:]))
        plain = await asyncio.gather(*(_run(engines["none"], r) for r in requests))
        stats = await engine.proposer_stats()
        return texts, plain, stats

    (failed, *others), plain, stats = loop.run(run())
    assert failed.text == plain[0][0].text and failed.mat == 1.0
    assert [g.text for g, _ in others] == [g.text for g, _ in plain[1:]]
    assert stats["failed_requests"] >= 1


async def _collect(steps):
    async for step in steps:
        if step.generation is not None:
            return step.generation
    raise AssertionError("no generation")


def test_a_dead_engine_process_makes_the_engine_unhealthy(loop) -> None:
    """vLLM's engine process killed: ``check_health`` raises (Serve then replaces the
    replica) and a request in flight ends with an error instead of hanging."""
    from deployments.replica.vllm_engine import VLLMChatEngine

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = VLLMChatEngine(EngineSettings(model="smollm2-135m", dtype="fp32", engine="vllm",
                                           speculative_method="toolspec", kv_cache_gib=0.5,
                                           compile=False))
    try:
        engine.check_health()
        spawned = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        assert spawned

        async def killed_midway():
            opened = engine.open(_request("k1", [{"role": "user", "content": "Count to 500."}],
                                          max_tokens=400), None)
            steps = opened.steps
            await steps.__anext__()
            for process in spawned:
                os.kill(process.pid, signal.SIGKILL)
            with pytest.raises(Exception):  # noqa: B017 - vLLM's EngineDeadError, or ours
                async for _ in steps:
                    pass

        loop.run(killed_midway(), 120)
        deadline = time.monotonic() + 30
        while not engine.engine.errored and time.monotonic() < deadline:
            time.sleep(0.5)
        with pytest.raises(RuntimeError):
            engine.check_health()
    finally:
        engine.close()


def test_the_proposer_reads_the_replicas_drafting_settings() -> None:
    """What the replica puts in the environment of vLLM's worker is what the proposer there
    drafts by: the per-step cap on draft tokens (none when unset) and ``min_reach``."""
    from deployments.replica.vllm_engine import proposer_environment
    from toolspec.vllm.proposer import session_settings

    def through(settings: EngineSettings) -> tuple[int | None, float]:
        environment = {name: value for name, value in proposer_environment(settings).items()
                       if value is not None}
        drafted = session_settings(settings.speculative_tokens, environment)
        return drafted.step_tokens, drafted.min_reach

    assert through(EngineSettings(engine="vllm")) == (32, 0.3)  # the shipped defaults
    assert through(EngineSettings(engine="vllm", step_draft_tokens=None,
                                  min_reach=0.5)) == (None, 0.5)
