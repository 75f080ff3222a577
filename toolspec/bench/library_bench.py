"""How fast the call library imports and answers ``lookup_text`` as it grows.

``measure_library`` fills one library with synthetic but realistic calls (many tenants with
skewed traffic, each with its own tools, string / number / boolean / enum arguments, about one
call in ten a repeat of a recent one) up to each size in turn and, at each size, measures the
import rate, warm ``lookup_text`` latency for prefixes cut at random points of stored calls (with
and without the tool known), the process RSS and the size of the shard files.

Run: ``toolspec bench library DIR [--sizes 10000 100000 1000000] [--out FILE]``.
"""

from __future__ import annotations

import random
import resource
import statistics
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from toolspec.calls.formats import ToolCall
from toolspec.library.records import ARGUMENT_KEYS, STYLES
from toolspec.library.store import CallLibrary

VERBS = ["get", "search", "create", "update", "delete", "list", "book", "cancel", "send", "check"]
NOUNS = ["weather", "flight", "hotel", "invoice", "user", "order", "ticket", "meeting", "email",
         "payment", "reminder", "document", "stock_price", "route", "restaurant", "appointment",
         "playlist", "repository", "alarm", "translation"]
CITIES = ["Paris", "Berlin", "Tokyo", "New York", "São Paulo", "Lagos", "Mumbai", "Sydney",
          "Toronto", "Madrid", "Seoul", "Cairo", "Lima", "Oslo", "Nairobi", "Hanoi"]
WORDS = ("quarterly report budget meeting notes flight delay refund status project alpha "
         "release deadline invoice overdue customer feedback weekly sync design review").split()
PARAMETERS: dict[str, str] = {
    "city": "city", "destination": "city", "origin": "city", "date": "date", "start_date": "date",
    "user_id": "int", "order_id": "int", "limit": "small", "amount": "float", "query": "text",
    "subject": "text", "email": "email", "include_details": "bool", "unit": "enum",
    "priority": "enum", "currency": "enum", "page": "small", "title": "text",
}
ENUMS = {"unit": ["celsius", "fahrenheit"], "priority": ["low", "normal", "high"],
         "currency": ["USD", "EUR", "JPY", "GBP"]}


def _value(kind: str, name: str, rng: random.Random) -> Any:
    if kind == "city":
        return rng.choice(CITIES)
    if kind == "date":
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == "int":
        return rng.randint(1, 2_000_000)
    if kind == "small":
        return rng.randint(1, 50)
    if kind == "float":
        return round(rng.uniform(1, 5000), 2)
    if kind == "text":
        return " ".join(rng.choices(WORDS, k=rng.randint(2, 7)))
    if kind == "email":
        return f"{rng.choice(WORDS)}.{rng.randint(1, 9999)}@example.com"
    if kind == "bool":
        return rng.random() < 0.5
    return rng.choice(ENUMS[name])


class SyntheticCalls:
    """An endless, seeded stream of (call, tenant) with skewed tenants, tools and repeats."""

    def __init__(self, seed: int = 0, tenants: int = 64) -> None:
        self.rng = random.Random(seed)
        tools = [f"{verb}_{noun}" for verb in VERBS for noun in NOUNS]
        self.tenants = [f"tenant-{i:03d}" for i in range(tenants)]
        self.tenant_weights = [1 / (i + 1) for i in range(tenants)]  # Zipf-like traffic
        self.tools = {t: self.rng.sample(tools, self.rng.randint(8, 40)) for t in self.tenants}
        names = sorted(PARAMETERS)
        self.schemas = {tool: random.Random(tool).sample(names, random.Random(tool).randint(1, 5))
                        for tool in tools}
        self.recent: deque[tuple[ToolCall, str]] = deque(maxlen=5000)

    def __iter__(self) -> Iterator[tuple[ToolCall, str]]:
        rng = self.rng
        while True:
            if self.recent and rng.random() < 0.1:
                yield rng.choice(self.recent)
                continue
            tenant = rng.choices(self.tenants, self.tenant_weights)[0]
            tools = self.tools[tenant]
            tool = tools[min(int(rng.expovariate(0.25)), len(tools) - 1)]
            arguments = {name: _value(PARAMETERS[name], name, rng) for name in self.schemas[tool]}
            item = (ToolCall(tool, arguments), tenant)
            self.recent.append(item)
            yield item


def _memory() -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    fields["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return fields


def latency_percentiles(samples_ns: Sequence[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": ordered[-1] / 1e6,
            "mean_ms": statistics.fmean(ordered) / 1e6}


def _queries(samples: list[tuple[ToolCall, str]], n: int,
             rng: random.Random) -> list[tuple[str, str, str, Any, str | None]]:
    """(tenant, typed, arguments key, style, tool or None): prefixes of stored calls."""
    queries = []
    for call, tenant in rng.choices(samples, k=n):
        key = rng.choice(list(ARGUMENT_KEYS))
        style = rng.choice(list(STYLES.values()))
        text = style.dumps(ARGUMENT_KEYS[key].call_object(call))
        typed = text[:rng.randint(1, len(text) - 1)]
        queries.append((tenant, typed, key, style, call.name if rng.random() < 0.5 else None))
    return queries


def _time_lookups(library: CallLibrary, queries: list, k: int) -> dict[str, Any]:
    for tenant, typed, key, style, tool in queries:  # warm-up pass: page cache, code paths
        library.lookup_text(tenant, typed, key, style, tool, k)
    by_mode: dict[str, list[int]] = {"tool": [], "any_tool": []}
    found = 0
    for tenant, typed, key, style, tool in queries:
        start = time.perf_counter_ns()
        matches = library.lookup_text(tenant, typed, key, style, tool, k)
        by_mode["tool" if tool else "any_tool"].append(time.perf_counter_ns() - start)
        found += bool(matches)
    every = by_mode["tool"] + by_mode["any_tool"]
    return {"all": latency_percentiles(every), "tool": latency_percentiles(by_mode["tool"]),
            "any_tool": latency_percentiles(by_mode["any_tool"]),
            "found_fraction": found / len(every)}


def measure_library(directory: str | Path, sizes: Sequence[int] = (10_000, 100_000, 1_000_000),
                    lookups: int = 2000, *, shards: int = 8, k: int = 8, seed: int = 0,
                    batch_size: int = 10_000, log: Any = print) -> dict[str, Any]:
    """Fills a new library in ``directory`` to each of ``sizes`` calls and measures it.

    Writes only inside ``directory`` (which must be new or empty). Returns a JSON-ready dict
    with, per size, the import rate of the calls added since the previous size, ``lookup_text``
    latency percentiles over ``lookups`` warm queries, RSS and bytes on disk.
    """
    rng = random.Random(seed + 1)
    stream = iter(SyntheticCalls(seed))
    samples: list[tuple[ToolCall, str]] = []
    seen, results = 0, []
    with CallLibrary(directory, shards=shards) as library:
        for size in sorted(sizes):
            batch: list[tuple[ToolCall, str]] = []
            elapsed = 0.0
            added = size - seen
            while seen < size:
                batch = [next(stream) for _ in range(min(batch_size, size - seen))]
                for item in batch:  # reservoir sample of everything added so far
                    seen += 1
                    if len(samples) < lookups:
                        samples.append(item)
                    elif (slot := rng.randrange(seen)) < lookups:
                        samples[slot] = item
                start = time.perf_counter()
                library.add_many(batch, batch_size=batch_size)
                elapsed += time.perf_counter() - start
            stats = library.stats()
            timing = _time_lookups(library, _queries(samples, lookups, rng), k)
            entry = {
                "calls_added": size, "records": stats.calls, "tenants": stats.tenants,
                "tools": stats.tools, "import_calls_per_s": round(added / elapsed),
                "lookup": timing, "disk_bytes": stats.disk_bytes, "used_bytes": stats.used_bytes,
                "bytes_per_record": round(stats.used_bytes / max(1, stats.calls)),
                "memory": _memory(),
            }
            results.append(entry)
            log(f"{size:>9} calls ({stats.calls} records): import {entry['import_calls_per_s']}/s, "
                f"lookup p50 {timing['all']['p50_ms']:.3f} ms p99 {timing['all']['p99_ms']:.3f} ms "
                f"(tool known p99 {timing['tool']['p99_ms']:.3f}, any tool p99 "
                f"{timing['any_tool']['p99_ms']:.3f}), disk {stats.disk_bytes / 2**20:.0f} MiB, "
                f"RSS {entry['memory']['VmRSS'] / 2**20:.0f} MiB")
    return {"shards": shards, "k": k, "lookups": lookups, "scan_cap": library.scan_cap,
            "sizes": results}
