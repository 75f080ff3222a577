"""The call library across processes: readers see commits; a killed writer loses no commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO

from toolspec.calls.formats import ToolCall
from toolspec.library import CallLibrary

# Child processes load ``toolspec.library`` without running ``toolspec/__init__.py`` (which imports
# torch, seconds of start-up): they register the package directory by hand.
PRELUDE = f"""
import sys, time, types
package = types.ModuleType("toolspec")
package.__path__ = [{str(REPO / "toolspec")!r}]
sys.modules["toolspec"] = package
from toolspec.calls.formats import ToolCall
from toolspec.library import CallLibrary
"""


def child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + code, *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def expect(process: subprocess.Popen[str], line: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = process.stdout.readline().strip()  # type: ignore[union-attr]
        if got == line:
            return
        if not got and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"child never printed {line!r}: {process.stderr.read()}")  # type: ignore


READER = """
library = CallLibrary(sys.argv[1], map_size=64 * 1024)
print("seen A" if library.lookup_text("acme", '{"name": "a"') else "missing A", flush=True)
sys.stdin.readline()  # the parent writes B and grows the map meanwhile
found = library.lookup_text("acme", '{"name": "b"')  # must adopt the grown map first
print("seen B" if found else "missing B", flush=True)
print("adopted" if max(library.stats().map_sizes) > 64 * 1024 else "small map", flush=True)
library.add(ToolCall("c", {"from": "child"}), tenant="acme")
print("wrote C", flush=True)
"""


def test_another_process_sees_committed_writes_and_a_grown_map(tmp_path: Path) -> None:
    library = CallLibrary(tmp_path / "lib", shards=2, map_size=64 * 1024)
    library.add(ToolCall("a", {"x": 1}), tenant="acme")
    reader = child(READER, str(tmp_path / "lib"))
    try:
        expect(reader, "seen A")
        library.add(ToolCall("b", {"x": 2}), tenant="acme")
        library.add_many((ToolCall("big", {"i": i, "pad": "p" * 300}), "bulk") for i in range(2000))
        assert min(library.stats().map_sizes) > 64 * 1024  # the reader's map is now too small
        reader.stdin.write("go\n")  # type: ignore[union-attr]
        reader.stdin.flush()  # type: ignore[union-attr]
        expect(reader, "seen B")
        expect(reader, "adopted")
        expect(reader, "wrote C")
        assert reader.wait(timeout=20) == 0
    finally:
        reader.kill()
    assert library.lookup_text("acme", '{"name": "c"')[0].record.arguments == {"from": "child"}
    library.close()


WRITER = """
library = CallLibrary(sys.argv[1], shards=4)
for batch in range(3):
    library.add_many((ToolCall(f"tool{j % 5}", {"batch": batch, "j": j}), f"t{j % 3}")
                     for j in range(200))
    print(f"committed {batch}", flush=True)
if sys.argv[2] == "raw":  # die holding an open write transaction with uncommitted puts
    def hang(txn, dbs):
        txn.put(b"uncommitted", b"x", db=dbs["records"])
        print("in txn", flush=True)
        time.sleep(60)
    library._shards()[0].write(hang)
else:  # die somewhere inside a large add_many
    print("begin 3", flush=True)
    library.add_many((ToolCall(f"tool{j % 5}", {"batch": 3, "j": j, "pad": "p" * 50}), f"t{j % 3}")
                     for j in range(50_000))
    print("finished 3", flush=True)
"""

WRITE_AFTER = """
with CallLibrary(sys.argv[1]) as library:
    library.add_many((ToolCall(f"tool{j % 5}", {"after": j}), f"t{j % 3}") for j in range(50))
    print("wrote", flush=True)
"""


def kill_writer_then_check(tmp_path: Path, mode: str, wait_for: str, delay: float) -> None:
    path = tmp_path / "lib"
    writer = child(WRITER, str(path), mode)
    try:
        expect(writer, wait_for)
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=20) == -signal.SIGKILL
    finally:
        writer.kill()
    # The write lock the dead writer held must be recovered: a new writer gets through.
    after = child(WRITE_AFTER, str(path))
    expect(after, "wrote")
    assert after.wait(timeout=20) == 0
    with CallLibrary(path) as library:
        batches: dict[int, set[int]] = {}
        for record in library.records():
            if "batch" in record.arguments:
                batches.setdefault(record.arguments["batch"], set()).add(record.arguments["j"])
        for batch in range(3):
            assert batches[batch] == set(range(200)), f"committed batch {batch} lost calls"
        assert len(batches.get(3, ())) < 50_000
        with library._shards()[0].read() as (txn, dbs):
            assert txn.get(b"uncommitted", db=dbs["records"]) is None
        stats = library.stats()
        assert stats.calls == sum(map(len, batches.values())) + 50
        assert library.lookup_text("t0", '{"name": "tool0", "arguments": {"batch": 1', k=3)


def test_writer_killed_inside_a_write_transaction_loses_nothing_committed(tmp_path: Path) -> None:
    kill_writer_then_check(tmp_path, "raw", "in txn", 0.0)


def test_writer_killed_inside_a_large_batch_loses_nothing_committed(tmp_path: Path) -> None:
    kill_writer_then_check(tmp_path, "batch", "begin 3", 0.3)
