"""The replica without Ray: requests interleave step by step; the library view fills ahead of
use and survives a retrieval actor that is down."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from serve_fakes import ScriptedChatEngine, fixed

from deployments.library.cache import LibraryCache
from deployments.messages import ChatRequest, StreamEnd, StreamStart, TextStep
from deployments.replica.model_replica import ModelReplica
from deployments.replica.scheduler import BatchScheduler
from toolspec.calls.formats import ToolCall
from toolspec.calls.tools import ToolSet
from toolspec.core.engine import Generation, StepEvent, StepOutcome, StepResult
from toolspec.library import CallLibrary, CallRecord

WEATHER = ToolSet.from_openai([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}])
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(name: str = "r", tools: ToolSet | None = WEATHER) -> ChatRequest:
    return ChatRequest(name, "toy", ({"role": "user", "content": "hi"},), tools=tools)


class CountingJob:
    """A job of ``count`` steps; its event's tokens are (its name's code, step number)."""

    def __init__(self, name: str, count: int, fail_at: int | None = None) -> None:
        self.name, self.count, self.fail_at = name, count, fail_at
        self.done = False
        self.closed = False
        self.taken = 0

    def close(self) -> None:
        self.done = self.closed = True


def counting_step(batches: list[list[str]], step_s: float = 0.0) -> Any:
    """A ``step`` function that records each batch's job names (``step_s``: a forward)."""
    def step(jobs: list[CountingJob]) -> StepResult:
        time.sleep(step_s)
        batches.append([job.name for job in jobs])
        outcomes = []
        for job in jobs:
            if job.taken == job.fail_at:
                job.close()
                outcomes.append(StepOutcome(error=RuntimeError("boom")))
                continue
            job.taken += 1
            job.done = job.taken == job.count
            generation = Generation(1, (), "", "stop", 0.0, 0.0, ()) if job.done else None
            outcomes.append(StepOutcome(StepEvent((job.taken,), job.name, None, generation)))
        return StepResult(outcomes)
    return step


def test_scheduler_runs_every_active_request_in_each_step() -> None:
    batches: list[list[str]] = []

    async def consume(scheduler: BatchScheduler, job: CountingJob) -> list[str]:
        return [event.text async for event in scheduler.run(job)]

    async def main() -> tuple[list[str], list[str]]:
        scheduler = BatchScheduler(counting_step(batches))
        long, short = await asyncio.gather(consume(scheduler, CountingJob("a", 6)),
                                           consume(scheduler, CountingJob("b", 2)))
        scheduler.shutdown()
        return long, short

    long, short = asyncio.run(main())
    assert long == ["a"] * 6 and short == ["b"] * 2
    assert ["a", "b"] in batches  # one forward for both
    assert len(batches) <= 7  # not 8: the short request rode along


def test_a_full_batch_rotates_so_every_request_advances() -> None:
    batches: list[list[str]] = []

    async def main() -> None:
        scheduler = BatchScheduler(counting_step(batches), max_batch=2)
        jobs = [CountingJob(name, 3) for name in "abc"]
        await asyncio.gather(*[consume_all(scheduler, job) for job in jobs])
        scheduler.shutdown()

    asyncio.run(main())
    assert all(len(batch) <= 2 for batch in batches)
    assert sum(batch.count("c") for batch in batches) == 3


async def consume_all(scheduler: BatchScheduler, job: Any) -> list[Any]:
    return [event async for event in scheduler.run(job)]


def test_scheduler_closes_a_request_whose_consumer_left() -> None:
    job = CountingJob("x", 100)

    async def main() -> None:
        scheduler = BatchScheduler(counting_step([], step_s=0.02))
        stream = scheduler.run(job)
        await anext(stream)
        await stream.aclose()
        for _ in range(200):  # the worker closes it on its next turn
            await asyncio.sleep(0.01)
            if job.closed:
                break
        scheduler.shutdown()

    asyncio.run(main())
    assert job.closed and job.taken < 100


def test_a_failing_request_fails_alone() -> None:
    async def main() -> list[Any]:
        scheduler = BatchScheduler(counting_step([]))
        broken, fine = CountingJob("x", 5, fail_at=1), CountingJob("y", 3)

        async def expect_failure() -> None:
            with pytest.raises(RuntimeError, match="boom"):
                await consume_all(scheduler, broken)

        _, events = await asyncio.gather(expect_failure(), consume_all(scheduler, fine))
        scheduler.shutdown()
        return events

    assert [event.text for event in asyncio.run(main())] == ["y"] * 3


def test_replica_events_start_steps_end() -> None:
    async def main() -> list[Any]:
        replica = ModelReplica(ScriptedChatEngine(script=fixed("ab", "cde")), name="r0")
        return [event async for event in replica.generate(request())]

    events = asyncio.run(main())
    assert isinstance(events[0], StreamStart) and events[0].replica == "r0"
    assert [e.text for e in events if isinstance(e, TextStep)] == ["ab", "cde"]
    assert isinstance(events[-1], StreamEnd) and events[-1].completion_tokens == 5


class FakeRemote:
    """The retrieval actor: serves stored records, or fails like a dead actor."""

    def __init__(self, records: list[CallRecord], down: bool = False) -> None:
        self.records = records
        self.down = down
        self.added: list[tuple[str, list[Any]]] = []

    async def top_calls(self, tenant: str, tools: list[str], per_tool: int) -> list[CallRecord]:
        if self.down:
            raise ConnectionError("actor died")
        return [r for r in self.records if r.tool in tools]

    async def add_calls(self, tenant: str, calls: list[Any]) -> int:
        if self.down:
            raise ConnectionError("actor died")
        self.added.append((tenant, calls))
        return len(calls)


@pytest.fixture
def stored(tmp_path: Any) -> list[CallRecord]:
    with CallLibrary(tmp_path / "shared") as library:
        library.add(ToolCall("get_weather", {"city": "Bergen"}))
        library.add(ToolCall("other_tool", {"x": 1}))
        return list(library.records())


def test_prefetched_calls_reach_the_local_view_and_finished_calls_go_back(stored) -> None:
    remote = FakeRemote(stored)

    async def main() -> LibraryCache:
        cache = LibraryCache(remote)
        replica = ModelReplica(ScriptedChatEngine(script=fixed(CALL)), cache)
        async for _ in replica.generate(request()):
            pass
        await cache.drain()
        return cache

    cache = asyncio.run(main())
    local = cache.local.lookup_text("default", '{"name": "get_weather", "arguments": {"city": "')
    assert sorted(m.continuation for m in local) == ['Bergen"}}', 'Oslo"}}']
    assert cache.fetched == 1  # only the requested tool's call
    assert remote.added == [("default", [("get_weather", {"city": "Oslo"})])]
    cache.close()


def test_retrieval_actor_down_requests_still_succeed_and_backoff_applies(stored) -> None:
    remote = FakeRemote(stored, down=True)

    async def main() -> tuple[LibraryCache, list[Any], int]:
        cache = LibraryCache(remote, retry_after_s=60)
        replica = ModelReplica(ScriptedChatEngine(script=fixed(CALL)), cache)
        events = [e async for e in replica.generate(request())]
        await cache.drain()
        # The first request's prefetch and write-back may both be in flight before either
        # fails (how they interleave is up to the event loop), so it sees one or two failures.
        first_failures = cache.failures
        events += [e async for e in replica.generate(request())]
        await cache.drain()
        return cache, events, first_failures

    cache, events, first_failures = asyncio.run(main())
    assert sum(isinstance(e, StreamEnd) for e in events) == 2
    assert first_failures in (1, 2)
    assert cache.failures == first_failures  # the second request did not ask the dead actor
    assert cache.local.stats().calls == 1  # the finished call is still drafted from locally
    cache.close()


@pytest.mark.real_model
def test_the_next_turn_takes_its_prompt_from_the_prefix_cache_with_the_same_output() -> None:
    from deployments.replica.engine import EngineSettings
    from deployments.replica.toolspec_engine import ToolSpecChatEngine

    engine = ToolSpecChatEngine(EngineSettings(model="smollm2-135m", dtype="float32",
                                               draft_budget=4, step_rows=0))
    replica = ModelReplica(engine, name="r0")

    def turn(messages: list[dict[str, str]], tenant: str) -> tuple[StreamStart, StreamEnd, str]:
        chat = ChatRequest("t", "smollm2-135m", tuple(messages), max_tokens=12, tenant=tenant)

        async def run() -> list[Any]:
            return [event async for event in replica.generate(chat)]

        events = asyncio.run(run())
        return events[0], events[-1], "".join(e.text for e in events if isinstance(e, TextStep))

    first = [{"role": "system", "content": "You are a helpful assistant. " * 12},
             {"role": "user", "content": "Name three colors."}]
    start, end, answer = turn(first, "acme")
    assert end.cached_tokens == 0
    second = first + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": "And three fruits?"}]
    _, reused_end, reused = turn(second, "acme")
    _, fresh_end, fresh = turn(second, "other-tenant")  # shares nothing with acme's cache
    assert reused_end.cached_tokens >= start.prompt_tokens // 32 * 32 > 0
    assert fresh_end.cached_tokens == 0 and reused == fresh
    stats = engine.prefix_cache.stats()
    assert stats.hit_blocks == reused_end.cached_tokens // 32
    replica.shutdown()


class GatedEngine(ScriptedChatEngine):
    """A scripted engine whose requests each wait for ``release`` before their first step
    (a request held mid-prefill), naming the engine in every answer."""

    def __init__(self, name: str) -> None:
        super().__init__(script=fixed(f"{name}-a", f"{name}-b"))
        self.release = asyncio.Event()

    def open(self, request: ChatRequest, library: CallLibrary | None) -> Any:
        opened = super().open(request, library)
        gate, steps = self.release, opened.steps

        async def gated():
            await gate.wait()
            async for step in steps:
                yield step

        return type(opened)(opened.call_format, opened.prompt_tokens, gated(),
                            opened.constrained)


def test_a_reload_waits_for_the_requests_in_flight_then_swaps_the_engine() -> None:
    """Issue 51, item 2: a request in flight finishes on the engine it started on; the old
    engine closes only after; a request arriving meanwhile waits and runs on the new one
    alone; no request sees two engines."""
    old, new = GatedEngine("old"), GatedEngine("new")
    built: list[str] = []
    replica = ModelReplica(old)

    def build() -> GatedEngine:
        built.append("new")
        assert old.closed, "the old engine must be closed before the new one is built"
        return new

    async def scenario() -> tuple[str, str]:
        async def text(name: str) -> str:
            return "".join([e.text async for e in replica.generate(request(name))
                            if isinstance(e, TextStep)])

        first = asyncio.create_task(text("in-flight"))
        await asyncio.sleep(0.05)  # it holds the old engine, waiting mid-prefill
        reload = asyncio.create_task(replica.reload(build, drain_timeout_s=30))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(text("arrives-during-reload"))
        await asyncio.sleep(0.05)
        assert built == [] and not old.closed  # draining: nothing swapped under the request
        old.release.set()
        assert await first == "old-aold-b"
        await reload
        new.release.set()
        return await second, replica.engine

    second, engine = asyncio.run(scenario())
    assert second == "new-anew-b" and engine is new
    assert [r.request_id for r in old.requests] == ["in-flight"]
    assert [r.request_id for r in new.requests] == ["arrives-during-reload"]
    new.close()


def test_a_failed_reload_makes_the_replica_unhealthy() -> None:
    replica = ModelReplica(ScriptedChatEngine())

    def build() -> ScriptedChatEngine:
        raise RuntimeError("no such model")

    with pytest.raises(RuntimeError):
        asyncio.run(replica.reload(build, drain_timeout_s=1))
    with pytest.raises(RuntimeError, match="failed to reload"):
        replica.engine.check_health()
    assert replica.engine.describe()["reloading"] is True


def test_a_live_reconfigure_is_checked_as_the_deployments_config_is() -> None:
    """``user_config`` goes through ``EngineSettings``' own checks: a bad value fails the
    update naming its field, and the engine serves on with its settings unchanged; a good
    value that needs no reload applies in place."""
    from pydantic import ValidationError
    from serve_fakes import scripted_factory

    from deployments.replica.model_replica import ModelServer

    server = ModelServer({"engine": "toolspec", "draft_budget": 8}, None,
                         scripted_factory(fixed("Hi.")))
    engine = server.replica.engine
    for bad, field in (({"speculative_tokens": 0}, "speculative_tokens"),
                       ({"min_reach": 2}, "min_reach"), ({"draft_budgets": 4}, "draft_budgets"),
                       ({"engine": "vllm", "exact_bf16": True}, "exact_bf16")):
        with pytest.raises(ValidationError, match=field):
            asyncio.run(server.reconfigure(bad))
        assert server.settings.draft_budget == 8 and server.replica.engine is engine
    asyncio.run(server.reconfigure({"draft_budget": 16}))
    assert engine.settings.draft_budget == 16 and server.replica.engine is engine
    server.replica.shutdown()
