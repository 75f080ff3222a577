"""Retrieval during decoding: once the output names a call's tool (and as it types the
arguments), the replica asks the retrieval actor for the stored calls that extend it, without
ever holding a decoding step; the first step after they arrive drafts from them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from serve_fakes import ProbingChatEngine

from deployments.library.cache import LibraryCache
from deployments.library.service import LibraryService
from deployments.messages import ChatRequest, StreamEnd, StreamStart, TextStep
from deployments.replica.model_replica import ModelReplica
from toolspec.calls.formats import ToolCall
from toolspec.calls.tools import ToolSet
from toolspec.library import CallRecord

WEATHER = ToolSet.from_openai([{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}])
NAMED = '<tool_call>\n{"name": "get_weather"'
ARGUMENTS = ', "arguments": {"city": "'
PROBE = '{"name": "get_weather", "arguments": {"city": "'


class SlowRemote:
    """The retrieval actor over a real ``LibraryService``; ``matching_calls`` answers only
    once ``release`` is set (a slow actor). Records each ``typed`` it was asked for."""

    def __init__(self, service: LibraryService) -> None:
        self.service = service
        self.release = asyncio.Event()
        self.asked: list[str] = []

    async def top_calls(self, tenant: str, tools: list[str], per_tool: int) -> list[CallRecord]:
        return await self.service.top_calls(tenant, tools, per_tool)

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[CallRecord], bool]:
        self.asked.append(typed)
        await self.release.wait()
        return await self.service.matching_calls(tenant, tool, typed, arguments_key, k)

    async def add_calls(self, tenant: str, calls: list[Any]) -> int:
        return await self.service.add_calls(tenant, calls)


def service_with(tmp_path: Path, cities: dict[str, int]) -> LibraryService:
    """A retrieval actor's library holding a get_weather call per city, used that often."""
    service = LibraryService(str(tmp_path / "shared"))
    for city, uses in cities.items():
        for _ in range(uses):
            service.library.add(ToolCall("get_weather", {"city": city}))
    return service


def request() -> ChatRequest:
    return ChatRequest("r", "toy", ({"role": "user", "content": "hi"},), tools=WEATHER)


async def next_text(events: Any, engine: ProbingChatEngine, step: int) -> str:
    """Release ``step`` and take its event."""
    engine.gates[step].set()
    event = await anext(events)
    assert isinstance(event, TextStep)
    return event.text


def test_a_slow_lookup_never_holds_a_step_and_a_later_step_drafts_what_arrived(
        tmp_path: Path) -> None:
    # Oslo is the most used call (prefetched at start); Bergen only turns up once the output
    # has named the tool and the replica asks for the calls extending it.
    service = service_with(tmp_path, {"Oslo": 3, "Bergen": 1})
    remote = SlowRemote(service)
    pieces = [NAMED, ARGUMENTS, "Bergen", '"}}\n</tool_call>']
    engine = ProbingChatEngine(pieces, PROBE, gated=True)

    async def main() -> list[Any]:
        cache = LibraryCache(remote, per_tool=1, timeout_s=600)
        replica = ModelReplica(engine, cache)
        events = replica.generate(request())
        assert isinstance(await anext(events), StreamStart)
        await cache.drain()  # the start-of-request prefetch (top call per tool) is in
        assert await next_text(events, engine, 0) == NAMED
        assert cache.lookups == 1  # the tool is known: ask
        await next_text(events, engine, 1)  # decoding goes on while the actor is slow
        await next_text(events, engine, 2)
        assert cache.lookups == 1  # one lookup in flight at a time
        assert remote.asked == ['{"name": "get_weather"'] and not remote.release.is_set()
        remote.release.set()
        await cache.drain()
        await next_text(events, engine, 3)
        rest = [event async for event in events]
        await cache.drain()
        cache.close()
        return rest

    rest = asyncio.run(main())
    assert isinstance(rest[-1], StreamEnd)
    before, after = engine.seen[1:3], engine.seen[3]
    assert before == [['Oslo"}}'], ['Oslo"}}']]  # steps while the lookup was out
    assert after == ['Bergen"}}', 'Oslo"}}']  # the first step after it arrived
    assert len(remote.asked) == 1  # it returned every match: nothing more to ask


def test_lookups_narrow_with_the_typed_value_until_every_match_is_in(tmp_path: Path) -> None:
    cities = {"Bergen": 1, "Berlin": 1, "Bern": 1, "Oslo": 1, "Paris": 1}
    remote = SlowRemote(service_with(tmp_path, cities))
    remote.release.set()
    pieces = [NAMED, ARGUMENTS, "Ber", "g", 'en"}}\n</tool_call>']
    engine = ProbingChatEngine(pieces, PROBE + "Berg", gated=True)

    async def main() -> None:
        cache = LibraryCache(remote, per_tool=0, per_lookup=2, timeout_s=600)
        replica = ModelReplica(engine, cache)
        events = replica.generate(request())
        await anext(events)
        for step in range(len(pieces)):
            await next_text(events, engine, step)
            await cache.drain()  # a fast actor: each lookup is back before the next step
        async for _ in events:
            pass
        cache.close()

    asyncio.run(main())
    # 2 matches per lookup: the tool alone, then "Ber" match more than 2 calls; "Berg" only
    # Bergen, after which nothing longer is asked for.
    assert remote.asked == ['{"name": "get_weather"', PROBE, PROBE + "Ber", PROBE + "Berg"]
    assert engine.seen[-1] == ['en"}}']


class DownRemote(SlowRemote):
    """A dead retrieval actor: every call fails."""

    async def top_calls(self, tenant: str, tools: list[str], per_tool: int) -> list[CallRecord]:
        raise ConnectionError("actor died")

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[CallRecord], bool]:
        raise ConnectionError("actor died")


def test_with_the_actor_down_no_lookup_is_tried_and_decoding_finishes(tmp_path: Path) -> None:
    pieces = [NAMED, ARGUMENTS, 'Oslo"}}\n</tool_call>']
    engine = ProbingChatEngine(pieces, PROBE, gated=True)

    async def main() -> tuple[LibraryCache, list[Any]]:
        cache = LibraryCache(DownRemote(service_with(tmp_path, {})), retry_after_s=600)
        events = ModelReplica(engine, cache).generate(request())
        await anext(events)
        await cache.drain()  # the prefetch has failed
        for step in range(len(pieces)):
            await next_text(events, engine, step)
        rest = [event async for event in events]
        await cache.drain()
        return cache, rest

    cache, events = asyncio.run(main())
    assert isinstance(events[-1], StreamEnd)
    # The failed prefetch marked the actor down: the output's tool asked for nothing.
    assert cache.failures == 1 and cache.lookups == 0
    cache.close()


@pytest.mark.parametrize("tool, typed, cities, complete", [
    ("get_weather", '{"name": "get_weather"', 2, False),  # 3 calls, 2 asked for
    ("get_weather", '{"name":"get_weather","arguments":{"city":"O', ["Oslo"], True),  # compact
    ("get_weather", '{"name": "get_weather", "arguments": {"city": "P', ["Paris"], True),
    ("get_time", '{"name": "get_time"', [], True),
])
def test_the_actor_answers_the_calls_extending_the_typed_text_in_its_spacing(
        tmp_path: Path, tool: str, typed: str, cities: Any, complete: bool) -> None:
    service = service_with(tmp_path, {"Oslo": 1, "Bergen": 1, "Paris": 1})
    records, every_match = asyncio.run(
        service.matching_calls("default", tool, typed, "arguments", 2))
    found = sorted(record.arguments["city"] for record in records)
    assert every_match is complete
    assert len(found) == cities if isinstance(cities, int) else found == cities
    assert asyncio.run(service.matching_calls("acme", tool, typed, "arguments", 2)) == ([], True)


def test_the_actor_marks_the_calls_a_lookup_served_as_used(tmp_path: Path) -> None:
    service = service_with(tmp_path, {"Oslo": 1, "Paris": 1})
    before = {r.arguments["city"]: r.last_used for r in service.library.records()}
    service.library.clock = lambda: max(before.values()) + 100.0
    service.touch_every_s = 0.0

    async def lookup() -> None:
        await service.matching_calls("default", "get_weather",
                                     '{"name": "get_weather", "arguments": {"city": "O',
                                     "arguments", 4)
        await service._flusher  # the batch of used calls is written

    asyncio.run(lookup())
    after = {r.arguments["city"]: (r.last_used, r.hits) for r in service.library.records()}
    assert after["Oslo"] == (max(before.values()) + 100.0, 1)  # used now, no extra hit
    assert after["Paris"] == (before["Paris"], 1)  # not served: untouched
