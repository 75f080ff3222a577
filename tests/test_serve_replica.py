"""The replica without Ray: requests interleave step by step; the library view fills ahead of
use and survives a retrieval actor that is down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from deployments.library_cache import LibraryCache
from deployments.messages import ChatRequest, StreamEnd, StreamStart, TextStep
from deployments.replica import ModelReplica
from deployments.scheduler import StepScheduler
from serve_fakes import ScriptedChatEngine, fixed
from toolspec.formats import ToolCall
from toolspec.library import CallLibrary, CallRecord
from toolspec.tools import ToolSet

WEATHER = ToolSet.from_openai([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}])
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(name: str = "r", tools: ToolSet | None = WEATHER) -> ChatRequest:
    return ChatRequest(name, "toy", ({"role": "user", "content": "hi"},), tools=tools)


def test_scheduler_takes_requests_in_turn() -> None:
    order: list[str] = []

    def steps(name: str, count: int) -> Iterator[str]:
        for i in range(count):
            order.append(f"{name}{i}")
            yield f"{name}{i}"

    async def consume(scheduler: StepScheduler, name: str, count: int) -> list[str]:
        return [item async for item in scheduler.run(steps(name, count))]

    async def main() -> tuple[list[str], list[str]]:
        scheduler = StepScheduler()
        long, short = await asyncio.gather(consume(scheduler, "a", 6), consume(scheduler, "b", 2))
        scheduler.shutdown()
        return long, short

    long, short = asyncio.run(main())
    assert long == [f"a{i}" for i in range(6)] and short == ["b0", "b1"]
    assert order.index("b1") < order.index("a2")  # the short request did not wait for the long


def test_scheduler_closes_a_request_whose_consumer_left() -> None:
    closed: list[bool] = []

    def steps() -> Iterator[int]:
        try:
            for i in range(100):
                yield i
        finally:
            closed.append(True)

    async def main() -> None:
        scheduler = StepScheduler()
        stream = scheduler.run(steps())
        assert await anext(stream) == 0
        await stream.aclose()
        for _ in range(20):  # the worker closes it on its next turn
            await asyncio.sleep(0.01)
            if closed:
                break
        scheduler.shutdown()

    asyncio.run(main())
    assert closed == [True]


def test_a_failing_request_fails_alone() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise RuntimeError("boom")

    async def main() -> list[int]:
        scheduler = StepScheduler()
        with pytest.raises(RuntimeError, match="boom"):
            async for _ in scheduler.run(broken()):
                pass
        result = [item async for item in scheduler.run(iter([7, 8]))]
        scheduler.shutdown()
        return result

    assert asyncio.run(main()) == [7, 8]


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

    async def main() -> tuple[LibraryCache, list[Any]]:
        cache = LibraryCache(remote, retry_after_s=60)
        replica = ModelReplica(ScriptedChatEngine(script=fixed(CALL)), cache)
        events = [e async for e in replica.generate(request())]
        await cache.drain()
        events += [e async for e in replica.generate(request())]
        await cache.drain()
        return cache, events

    cache, events = asyncio.run(main())
    assert sum(isinstance(e, StreamEnd) for e in events) == 2
    assert cache.failures == 1  # the second request did not wait on the dead actor again
    assert cache.local.stats().calls == 1  # the finished call is still drafted from locally
    cache.close()


@pytest.mark.real_model
def test_second_turn_of_a_session_prefills_only_new_tokens_with_the_same_output() -> None:
    from deployments.chat_engine import EngineSettings, ToolSpecChatEngine

    engine = ToolSpecChatEngine(EngineSettings("smollm2-135m", "float32", draft_budget=4))
    replica = ModelReplica(engine, name="r0")

    def turn(messages: list[dict[str, str]], session: str | None) -> tuple[StreamStart, str]:
        chat = ChatRequest("t", "smollm2-135m", tuple(messages), max_tokens=12, session_id=session)

        async def run() -> list[Any]:
            return [event async for event in replica.generate(chat)]

        events = asyncio.run(run())
        return events[0], "".join(e.text for e in events if isinstance(e, TextStep))

    first = [{"role": "user", "content": "Name three colors."}]
    start, answer = turn(first, "s1")
    assert start.prefix_reused == 0
    second = first + [{"role": "assistant", "content": answer},
                      {"role": "user", "content": "And three fruits?"}]
    reused_start, reused = turn(second, "s1")
    fresh_start, fresh = turn(second, None)
    assert reused_start.prefix_reused > start.prompt_tokens // 2
    assert fresh_start.prefix_reused == 0 and reused == fresh
    assert engine.sessions.stats().hits == 1
    replica.shutdown()
