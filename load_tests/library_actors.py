"""Decode-time lookups against the call library served by 1 and by N retrieval actors.

Fills a library with ``--calls`` synthetic calls (``toolspec.bench.library_bench.SyntheticCalls``:
64 tenants, ~200 tools, realistic arguments; reused if the directory already holds them), then,
on a local Ray started here, for each actor count: starts that many ``LibraryService`` actors
(each owning its part of the shards, as the deployment does), and ``--clients`` concurrent
callers send ``matching_calls`` (a prefix of a stored call, the tool known: what a replica asks
while the output types a call) through ``ShardedLibraryRemote`` for ``--seconds``. Reports
lookups per second and latency p50/p99 per actor count; writes ``results.json`` to ``--out``.
Bounded and local: no network beyond this machine's Ray.

    .venv/bin/python load_tests/library_actors.py --calls 1000000 --actors 1,2 \\
        --out results/library-actors
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

import ray

from deployments.library.cache import ShardedLibraryRemote
from deployments.library.service import LibraryService
from toolspec.bench.library_bench import SyntheticCalls, latency_percentiles
from toolspec.library import CallLibrary
from toolspec.library.records import ARGUMENT_KEYS, STYLES


def fill(path: Path, calls: int, shards: int) -> list[tuple[Any, str]]:
    """The library at ``path`` holding ``calls`` synthetic calls; a sample of them."""
    stream = iter(SyntheticCalls(seed=0))
    with CallLibrary(path, shards=shards, sync=False) as library:
        have = library.stats().calls
        if have == 0:
            began = time.perf_counter()
            for start in range(0, calls, 50_000):
                library.add_many(islice(stream, min(50_000, calls - start)))
                print(f"  {min(start + 50_000, calls):,} calls added", flush=True)
            print(f"filled in {time.perf_counter() - began:.0f} s", flush=True)
        return [(record.call, record.tenant) for record in islice(library.records(), 0, None, 97)]


@ray.remote
class PartActor:
    """A retrieval actor as the deployment runs it: a ``LibraryService`` owning one part."""

    def __init__(self, path: str, part: tuple[int, int]) -> None:
        self.service = LibraryService(path, max_calls=None, part=part)

    async def matching_calls(self, *args: Any) -> Any:
        return await self.service.matching_calls(*args)

    async def stats(self) -> dict[str, Any]:
        return await self.service.stats()


async def load(remote: ShardedLibraryRemote, queries: list[tuple[str, str, str]],
               clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[int] = []
    deadline = time.perf_counter() + seconds

    async def client(index: int) -> None:
        rng = random.Random(index)
        while time.perf_counter() < deadline:
            tenant, tool, typed = rng.choice(queries)
            start = time.perf_counter_ns()
            await remote.matching_calls(tenant, tool, typed, "arguments", 16)
            latencies.append(time.perf_counter_ns() - start)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return {"lookups": len(latencies), "per_s": len(latencies) / seconds,
            **latency_percentiles(latencies)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, default=Path("/tmp/toolspec-library-actors"))
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=Path("results/library-actors"))
    args = parser.parse_args()
    sample = fill(args.path, args.calls, args.shards)
    rng, style = random.Random(1), STYLES["default"]
    queries = []
    for call, tenant in rng.sample(sample, min(2000, len(sample))):
        text = style.dumps(ARGUMENT_KEYS["arguments"].call_object(call))
        queries.append((tenant, call.name, text[: rng.randint(len(call.name) + 10, len(text) - 1)]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    results: dict[str, Any] = {"calls": args.calls, "shards": args.shards,
                               "clients": args.clients, "seconds": args.seconds, "by_actors": {}}
    try:
        for count in (int(n) for n in args.actors.split(",")):
            actors = [PartActor.options(num_cpus=0).remote(str(args.path), (i, count))
                      for i in range(count)]
            remote = ShardedLibraryRemote(actors)  # Ray actor handles: method.remote(...)
            asyncio.run(load(remote, queries[:50], args.clients, 3.0))  # warm-up
            figures = asyncio.run(load(remote, queries, args.clients, args.seconds))
            results["by_actors"][count] = figures
            print(f"{count} actor(s): {figures['per_s']:.0f} lookups/s, p50 "
                  f"{figures['p50_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms", flush=True)
            for actor in actors:
                ray.kill(actor)
    finally:
        ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
