"""The library shared out over several owners: each part serves the shards ``s % N == i`` of one
directory, a call of another part is refused, and the replicas' remote sends every question to
the part that owns it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from deployments.library.cache import ShardedLibraryRemote
from deployments.library.service import LibraryService
from toolspec.calls.formats import ToolCall
from toolspec.library import CallLibrary, ShardNotOwnedError
from toolspec.library.keys import shard_of

TOOLS = [f"tool_{i}" for i in range(12)]


def test_parts_serve_disjoint_shards_of_one_library(tmp_path: Path) -> None:
    path = tmp_path / "library"
    parts = [CallLibrary(path, shards=4, part=(i, 2), sync=False) for i in range(2)]
    try:
        for tool in TOOLS:
            owner = parts[shard_of("acme", tool, 4) % 2]
            other = parts[1 - shard_of("acme", tool, 4) % 2]
            assert owner.owns("acme", tool) and not other.owns("acme", tool)
            owner.add(ToolCall(tool, {"x": 1}), "acme")
            with pytest.raises(ShardNotOwnedError, match="belongs to part"):
                other.add(ToolCall(tool, {"x": 2}), "acme")
            with pytest.raises(ShardNotOwnedError):
                other.top_calls("acme", 1, tool=tool)
        assert sum(part.stats().calls for part in parts) == len(TOOLS)
        assert all(part.stats().calls for part in parts)  # both parts hold some
        # Questions without a tool scan the part's own shards only.
        assert sorted(r.tool for p in parts for r in p.top_calls("acme", 50)) == sorted(TOOLS)
    finally:
        for part in parts:
            part.close()
    with CallLibrary(path) as whole:  # the same directory, opened whole
        assert sorted(r.tool for r in whole.records()) == sorted(TOOLS)
    with pytest.raises(ValueError, match="part"):
        CallLibrary(path, part=(2, 2))


class InProcessHandle:
    """A Serve handle's shape over a ``LibraryService`` in this process."""

    def __init__(self, service: LibraryService) -> None:
        self.service = service
        self.asked: list[str] = []

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                handle.asked.append(method)
                return getattr(handle.service, method)(*args)

        return Method


def test_the_remote_asks_the_part_that_owns_each_tool(tmp_path: Path) -> None:
    path = str(tmp_path / "library")
    handles = [InProcessHandle(LibraryService(path, shards=4, part=(i, 2))) for i in range(2)]
    remote = ShardedLibraryRemote(handles)

    async def run() -> None:
        stored = await remote.add_calls("acme", [(tool, {"x": 1}) for tool in TOOLS])
        assert stored == len(TOOLS)
        for index, handle in enumerate(handles):
            held = {r.tool for r in handle.service.library.records()}
            assert held == {t for t in TOOLS if shard_of("acme", t, 4) % 2 == index}
        records = await remote.top_calls("acme", TOOLS, 4)
        assert sorted(r.tool for r in records) == sorted(TOOLS)
        for tool in TOOLS[:4]:
            owner = handles[shard_of("acme", tool, 4) % 2]
            before = owner.asked.count("matching_calls")
            found, complete = await remote.matching_calls(
                "acme", tool, '{"name": "' + tool, "arguments", 4)
            assert [r.tool for r in found] == [tool] and complete
            assert owner.asked.count("matching_calls") == before + 1
        assert (await remote.stats())["calls"] == len(TOOLS)

    asyncio.run(run())
    for handle in handles:
        handle.service.library.close()


def test_each_part_imports_only_its_share_of_a_seed_file(tmp_path: Path) -> None:
    seed = tmp_path / "seed.jsonl"
    seed.write_text("\n".join(f'{{"name": "{tool}", "arguments": {{"x": 1}}}}' for tool in TOOLS))
    path = str(tmp_path / "library")
    services = [LibraryService(path, shards=4, part=(i, 2), seed_file=str(seed))
                for i in range(2)]
    assert sorted(r.tool for s in services for r in s.library.records()) == sorted(TOOLS)
    for service in services:
        service.library.close()
