"""The call library on real LMDB files: records, lookups, tenants, eviction, growth, files, CLI."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from helpers import REPO

from toolspec.calls.formats import (
    COMPACT_STYLE,
    DEFAULT_STYLE,
    FORMATS,
    INDENTED_STYLE,
    JsonStyle,
    ToolCall,
)
from toolspec.library import (
    CallLibrary,
    InvalidCallError,
    InvalidTenantError,
    LibraryClosedError,
    LibraryImportError,
    NotALibraryError,
    SettingMismatchError,
    ShardCountMismatchError,
    UnsupportedStyleError,
)
from toolspec.library.cli import add_library_commands
from toolspec.library.keys import MAX_KEY, encode_score, shard_of
from toolspec.library.query import successor
from toolspec.library.records import unpack_record

SAMPLE = REPO / "toolspec/bench/datasets/samples/apibank-level1-sample.json"
WEATHER = ToolCall("get_weather", {"city": "Paris", "unit": "celsius"})


@pytest.fixture
def library(tmp_path: Path) -> CallLibrary:
    with CallLibrary(tmp_path / "lib", sync=False) as opened:
        yield opened


def head(tool: str, key: str = "arguments", style: JsonStyle = DEFAULT_STYLE) -> str:
    """The text of a call object up to its arguments object (excluded)."""
    return style.dumps({"name": tool, key: {}})[:-3]


def test_record_keeps_written_order_renders_every_slot_and_dedupes(library: CallLibrary) -> None:
    first = library.add(WEATHER, tenant="acme", when=100.0)
    again = library.add(ToolCall("get_weather", {"unit": "celsius", "city": "Paris"}),
                        tenant="acme", when=200.0)
    assert (first.hits, again.hits) == (1, 2)
    assert (again.first_seen, again.last_used) == (100.0, 200.0)
    assert list(again.arguments) == ["city", "unit"]  # as first written
    assert again.canonical == '{"city":"Paris","unit":"celsius"}'
    for fmt in (FORMATS["hermes"], FORMATS["apibank"]):
        for style in (DEFAULT_STYLE, COMPACT_STYLE, INDENTED_STYLE):
            assert again.rendered(fmt.arguments_key, style) == style.dumps(fmt.call_object(WEATHER))
    assert library.stats().calls == 1
    library.add(WEATHER, tenant="other")  # same call, other tenant: another record
    assert library.stats().calls == 2


def test_lookup_text_continues_the_typed_call_ranked_by_hits_and_recency(
        library: CallLibrary) -> None:
    for city, times in (("Paris", 3), ("Pau", 1), ("Berlin", 2)):
        for _ in range(times):
            library.add(ToolCall("get_weather", {"city": city}), tenant="acme")
    library.add(ToolCall("get_time", {"city": "Paris"}), tenant="acme")
    typed = head("get_weather") + '{"city": "P'
    matches = library.lookup_text("acme", typed)
    assert [m.continuation for m in matches] == ['aris"}}', 'au"}}']
    assert matches[0].weight > matches[1].weight > 0
    assert matches[0].record.hits == 3
    # Recency: an old call with more hits loses to a fresh one once it has aged enough.
    library.add(ToolCall("search", {"q": "old"}), tenant="t", when=0.0)
    library.add(ToolCall("search", {"q": "old"}), tenant="t", when=1.0)
    library.add(ToolCall("search", {"q": "new"}), tenant="t")
    assert [m.record.arguments["q"] for m in library.lookup_text("t", head("search"))] == \
        ["new", "old"]
    # k, the empty continuation of a call typed in full, a prefix nothing extends.
    assert len(library.lookup_text("acme", "{", k=2)) == 2
    assert library.lookup_text("acme", typed + 'aris"}}') == []
    assert library.lookup_text("acme", head("nope")) == []


def test_lookup_text_styles_keys_and_tool_narrowing(library: CallLibrary) -> None:
    library.add(WEATHER, tenant="acme")
    library.add(ToolCall("get_weather_forecast", {"city": "Oslo"}), tenant="acme")
    typed = head("get_weather", "parameters", COMPACT_STYLE) + '{"city":'
    [match] = library.lookup_text("acme", typed, "parameters", COMPACT_STYLE)
    assert match.continuation == '"Paris","unit":"celsius"}}'
    # With the tool known, even '{' finds only that tool's calls (not get_weather_forecast).
    found = library.lookup_text("acme", "{", tool="get_weather")
    assert [m.record.tool for m in found] == ["get_weather"]
    assert found[0].continuation == DEFAULT_STYLE.dumps(FORMATS["json"].call_object(WEATHER))[1:]
    assert len(library.lookup_text("acme", "{")) == 2
    assert library.lookup_text("acme", head("get_time"), tool="get_weather") == []
    # One key per line (a fenced block's call object), the tool known from the typed name.
    typed = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "P'
    [match] = library.lookup_text("acme", typed, style=INDENTED_STYLE, tool="get_weather")
    assert match.continuation == 'aris",\n    "unit": "celsius"\n  }\n}'
    with pytest.raises(UnsupportedStyleError, match="compact"):
        library.lookup_text("acme", "{", style=JsonStyle(": ", ","))
    with pytest.raises(UnsupportedStyleError, match="parameters"):
        library.lookup_text("acme", "{", arguments_key="args")


def test_tenants_never_see_each_other(library: CallLibrary) -> None:
    names = ["a", "ab", "a b", "é", "a\x01", "b"]
    for name in names:
        library.add(ToolCall("echo", {"tenant": name}), tenant=name)
    for name in names:
        for typed, tool in (("{", None), (head("echo"), None), ("{", "echo")):
            found = library.lookup_text(name, typed, tool=tool)
            assert [m.record.arguments["tenant"] for m in found] == [name]
        assert [r.tenant for r in library.top_calls(name)] == [name]
    assert library.lookup_text("nobody", "{") == []
    for bad in ("a\0b", "", "x" * 200, None):
        with pytest.raises(InvalidTenantError):
            library.add(WEATHER, tenant=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidTenantError, match="NUL"):
        library.lookup_text("a\0", "{")


def test_calls_longer_than_an_lmdb_key(library: CallLibrary) -> None:
    long_a = ToolCall("write_file", {"path": "/tmp/a", "text": "x" * 600 + "A"})
    long_b = ToolCall("write_file", {"path": "/tmp/a", "text": "x" * 600 + "B"})
    library.add(long_a, tenant="t")
    library.add(long_b, tenant="t")
    library.add(long_b, tenant="t")
    full = DEFAULT_STYLE.dumps(FORMATS["json"].call_object(long_a))
    assert len(full.encode()) > MAX_KEY
    assert [m.continuation for m in library.lookup_text("t", full[:-4])] == ['B"}}', 'A"}}']
    assert [m.record.call for m in library.lookup_text("t", full[:-3])] == [long_a]
    assert {m.record.call.arguments["text"][-1] for m in library.lookup_text("t", full[:50])} == \
        {"A", "B"}
    ids = list(range(300))
    library.add(long_a, tenant="t", tokens={"tok": ids})
    assert library.lookup("t", "write_file", ids[:250], 4, "tok")[0][0] == ids[250:]
    assert library.lookup("t", "write_file", ids[:250] + [7], 4, "tok") == []


ROME = ToolCall("get_weather", {"city": "Rome"})


def test_token_lookup_by_fingerprint_and_tool(library: CallLibrary) -> None:
    library.add(WEATHER, tenant="acme", tokens={"qwen": [5, 6, 7, 8], "llama": [1, 2]})
    library.add(ROME, tenant="acme", tokens={"qwen": [5, 6, 9]})
    library.add(ToolCall("get_time", {}), tenant="acme", tokens={"qwen": [5, 1]})
    library.add(ROME, tenant="acme", tokens={"qwen": [5, 6, 9]})
    got = library.lookup("acme", "get_weather", [5, 6], 8, "qwen")
    assert [ids for ids, _ in got] == [[9], [7, 8]]  # Rome has 2 hits
    assert got[0][1] > got[1][1]
    assert sorted(ids for ids, _ in library.lookup("acme", None, [5], 8, "qwen")) == \
        [[1], [6, 7, 8], [6, 9]]
    assert library.lookup("acme", None, [5], 8, "llama") == []
    assert library.lookup("other", None, [5], 8, "qwen") == []
    # New ids for a fingerprint replace the old ones in the index.
    library.add(WEATHER, tenant="acme", tokens={"qwen": [5, 6, 0]})
    assert sorted(ids for ids, _ in library.lookup("acme", "get_weather", [5, 6], 8, "qwen")) == \
        [[0], [9]]
    with pytest.raises(InvalidCallError):
        library.add(WEATHER, tokens={"qwen": [-1]})


def test_top_calls(library: CallLibrary) -> None:
    for tool, city, times in (("a", "x", 1), ("a", "y", 4), ("b", "z", 3), ("c", "w", 2)):
        for _ in range(times):
            library.add(ToolCall(tool, {"city": city}), tenant="t")
    assert [(r.tool, r.hits) for r in library.top_calls("t", 3)] == [("a", 4), ("b", 3), ("c", 2)]
    assert [r.arguments["city"] for r in library.top_calls("t", 5, tool="a")] == ["y", "x"]


def test_lru_eviction_keeps_the_most_recently_used(tmp_path: Path) -> None:
    with CallLibrary(tmp_path / "lib", shards=4, max_calls=5, sync=False) as library:
        calls = [ToolCall(f"tool{i % 3}", {"i": i}) for i in range(10)]
        for i, call in enumerate(calls[:5]):
            library.add(call, tenant=f"t{i % 2}", when=float(i))
        library.add(calls[0], tenant="t0", when=10.0)  # a hit refreshes call 0
        for i, call in enumerate(calls[5:8], 5):
            library.add(call, tenant=f"t{i % 2}", when=float(i + 10))
        kept = {record.arguments["i"] for record in library.records()}
        assert kept == {0, 4, 5, 6, 7}
        assert library.stats().calls == 5
        assert library.lookup_text("t1", head("tool1") + '{"i": 1') == []  # index entries gone
        assert [r.arguments["i"] for r in library.top_calls("t1", 10, tool="tool1")] == [7]
        assert library.add_many([(c, "t0") for c in calls]) == 10
        assert library.stats().calls == 5


def test_full_map_grows_instead_of_failing(tmp_path: Path) -> None:
    with CallLibrary(tmp_path / "lib", shards=2, map_size=64 * 1024, sync=False) as library:
        for i in range(300):
            library.add(ToolCall("tool", {"i": i, "pad": "p" * 100}), tenant="t")
        added = library.add_many((ToolCall(f"t{i % 7}", {"text": "v" * 200, "i": i}), "u")
                                 for i in range(3000))
        stats = library.stats()
        assert added == 3000 and stats.calls == 3300
        assert min(stats.map_sizes) > 64 * 1024
    with CallLibrary(tmp_path / "lib", map_size=64 * 1024) as library:  # reopen small: still fine
        assert library.stats().calls == 3300
        assert len(library.lookup_text("u", "{", k=3)) == 3


def test_shard_count_is_fixed_at_creation(tmp_path: Path) -> None:
    CallLibrary(tmp_path / "lib", shards=3).close()
    assert (tmp_path / "lib" / "shard-02").is_dir() is False  # opened lazily
    with CallLibrary(tmp_path / "lib") as library:
        assert library.shards == 3
    with pytest.raises(ShardCountMismatchError, match="3 shards"):
        CallLibrary(tmp_path / "lib", shards=8)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    with pytest.raises(NotALibraryError):
        CallLibrary(tmp_path / "junk")
    assert shard_of("acme", "get_weather", 8) == 3  # a stable hash, not Python's hash()


def test_two_objects_on_one_directory_and_closing(tmp_path: Path) -> None:
    first = CallLibrary(tmp_path / "lib", sync=False)
    second = CallLibrary(tmp_path / "lib", sync=False)
    first.add(WEATHER)
    assert second.lookup_text("default", "{")[0].record.call == WEATHER
    first.close()
    first.close()
    assert second.stats().calls == 1
    with pytest.raises(LibraryClosedError):
        first.lookup_text("default", "{")
    second.close()


def test_forked_child_reopens_and_parent_keeps_working(tmp_path: Path) -> None:
    library = CallLibrary(tmp_path / "lib", sync=False)
    library.add(WEATHER)
    assert library.lookup_text("default", "{")
    pid = os.fork()
    if pid == 0:  # child: uses the inherited object, which must reopen the environments
        try:
            ok = len(library.lookup_text("default", "{")) == 1
            library.add(ToolCall("from_child", {}))
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {r.tool for r in library.records()} == {"get_weather", "from_child"}
    library.add(ToolCall("after_fork", {}))
    assert library.stats().calls == 3
    library.close()


def test_invalid_calls_are_rejected_with_reasons(library: CallLibrary) -> None:
    for call in (ToolCall("", {}), ToolCall("a\0b", {}), ToolCall("t", {"x": float("nan")}),
                 ToolCall("t", {"x": object()}), ToolCall("t", {"x": 2**70}),
                 ToolCall("t", [1, 2])):  # type: ignore[arg-type]
        with pytest.raises(InvalidCallError):
            library.add(call)
    with pytest.raises(InvalidCallError):
        library.add(WEATHER, when=-1.0)
    assert library.stats().calls == 0


def test_token_ids_with_ff_bytes(library: CallLibrary) -> None:
    top = 2**32 - 1
    library.add(ToolCall("t", {"a": 1}), tenant="x", tokens={"fp": [top, 5]})
    library.add(ToolCall("t", {"a": 2}), tenant="x", tokens={"fp": [top, top, 6]})
    library.add(ToolCall("t", {"a": 3}), tenant="x", tokens={"fp": [top - 1, 1]})
    assert sorted(ids for ids, _ in library.lookup("x", None, [top], 8, "fp")) == [[5], [top, 6]]
    assert library.lookup("x", "t", [top, top], 8, "fp")[0][0] == [6]
    assert successor(b"a\xff\xff") == b"b" and successor(b"\xff") is None


def test_encode_score_sorts_like_numbers() -> None:
    numbers = [-1e9, -2.5, -1e-9, 0.0, 1e-9, 1.0, 2811.5, 1e12]
    assert sorted(numbers, key=encode_score) == numbers


def test_import_apibank_and_jsonl_then_export_round_trip(tmp_path: Path,
                                                         library: CallLibrary) -> None:
    expected = sum(len(a) if isinstance(a, list) else 1
                   for a in (item["answer"] for item in json.loads(SAMPLE.read_text())))
    assert library.import_file(SAMPLE, tenant="bank") == expected
    [record] = library.top_calls("bank", 1, tool="ModifyRegistration")
    assert record.rendered("parameters").startswith('{"name": "ModifyRegistration", "parameters"')
    lines = tmp_path / "calls.jsonl"
    lines.write_text("\n".join([
        json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
        "",
        json.dumps({"name": "get_weather", "parameters": {"city": "Rome"}, "tenant": "acme"}),
        json.dumps({"name": "send", "arguments": '{"to": "bob"}'}),
    ]))
    assert library.import_file(lines, tenant="web") == 3
    assert [r.arguments for r in library.top_calls("acme")] == [{"city": "Rome"}]
    assert {r.tool for r in library.top_calls("web")} == {"get_weather", "send"}
    out = tmp_path / "out" / "export.jsonl"
    assert library.export(out, tenant="web") == 2
    assert library.export(out) == library.stats().calls
    with CallLibrary(tmp_path / "copy", shards=2) as copy:
        assert copy.import_file(out) == library.stats().calls
        def calls(lib: CallLibrary) -> set[tuple[str, str, str, int, float, float]]:
            return {(r.tenant, r.tool, r.canonical, r.hits, r.first_seen, r.last_used)
                    for r in lib.records()}
        assert calls(copy) == calls(library)  # hits and times come along


def test_an_import_keeps_hits_and_times_and_adds_to_a_stored_call(tmp_path: Path) -> None:
    with CallLibrary(tmp_path / "lib", shards=2, clock=lambda: 5_000.0) as library:
        for _ in range(3):
            library.add(ToolCall("f", {"x": 1}), "t", when=1_000.0)
        library.add(ToolCall("f", {"x": 1}), "t", when=2_000.0)
        export = tmp_path / "export.jsonl"
        library.export(export)
        [line] = [json.loads(row) for row in export.read_text().splitlines()]
        assert (line["hits"], line["first_seen"], line["last_used"]) == (4, 1_000.0, 2_000.0)
        with CallLibrary(tmp_path / "copy", shards=4, clock=lambda: 9_000.0) as copy:
            copy.add(ToolCall("f", {"x": 1}), "t", when=3_000.0)  # already known there once
            copy.import_file(export)
            [record] = copy.records()
            assert (record.hits, record.first_seen, record.last_used) == (5, 1_000.0, 3_000.0)
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({**line, "hits": 0}) + "\n")
        with pytest.raises(LibraryImportError, match="hits"):
            library.import_file(bad)


def test_a_lookup_refreshes_a_calls_place_in_the_lru_order(tmp_path: Path) -> None:
    with CallLibrary(tmp_path / "lib", shards=2, max_calls=2, sync=False) as library:
        old = library.add(ToolCall("f", {"x": "old"}), "t", when=1_000.0)
        library.add(ToolCall("f", {"x": "mid"}), "t", when=2_000.0)
        assert library.touch([old], when=3_000.0) == 1  # a lookup served it
        [touched] = [r for r in library.records() if r.arguments["x"] == "old"]
        assert (touched.hits, touched.last_used) == (1, 3_000.0)  # used, not one more hit
        library.add(ToolCall("f", {"x": "new"}), "t", when=4_000.0)  # over the cap: evict one
        assert {r.arguments["x"] for r in library.records()} == {"old", "new"}
        assert library.top_calls("t", 1)[0].arguments == {"x": "new"}  # ties: most recent
        assert library.touch([replace(old, canonical="{}")]) == 0  # not stored: skipped


def test_import_errors_name_the_file_and_line(tmp_path: Path, library: CallLibrary) -> None:
    with pytest.raises(LibraryImportError, match="no such file"):
        library.import_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a", "arguments": {}}\n{"name": oops}\n')
    with pytest.raises(LibraryImportError, match=r"bad.jsonl:2"):
        library.import_file(bad)
    bad.write_text('[{"system": "s", "user": "u", "answer": {"parameters": {}}}]')
    with pytest.raises(LibraryImportError, match=r"\[0\].*name"):
        library.import_file(bad)
    assert library.stats().calls == 0  # nothing written from a file that fails to parse


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="toolspec")
    add_library_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_import_stats_export(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSPEC_HOME", str(tmp_path / "home"))
    assert run_cli(["library", "stats"]) == 2
    assert "no call library" in capsys.readouterr().err
    assert run_cli(["library", "import", str(SAMPLE), "--tenant", "bank"]) == 0
    assert "imported" in capsys.readouterr().out
    assert (tmp_path / "home" / "library" / "library.json").exists()
    assert run_cli(["library", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["calls"] > 0 and stats["tenants"] == 1
    out = tmp_path / "x.jsonl"
    assert run_cli(["library", "export", str(out)]) == 0
    assert len(out.read_text().splitlines()) == stats["calls"]
    code = run_cli(["library", "import", str(tmp_path / "nope.json"), "--library",
                    str(tmp_path / "other")])
    captured = capsys.readouterr()
    assert code == 2 and "no such file" in captured.err and "Traceback" not in captured.err


def test_half_life_is_fixed_at_creation(tmp_path: Path) -> None:
    CallLibrary(tmp_path / "lib", half_life_s=60.0).close()
    with CallLibrary(tmp_path / "lib") as library:
        assert library.half_life_s == 60.0
    with pytest.raises(SettingMismatchError, match="half_life_s"):
        CallLibrary(tmp_path / "lib", half_life_s=3600.0)


def test_records_written_before_the_indented_style_still_render_it() -> None:
    old = msgpack.packb({"v": 1, "t": "acme", "n": WEATHER.name, "c": "{}", "a": WEATHER.arguments,
                         "r": {"arguments/default": "as stored"}, "k": {}, "h": 1, "f": 0.0,
                         "l": 0.0}, use_bin_type=True)
    record = unpack_record(old)
    assert record.rendered() == "as stored"
    assert record.rendered("parameters", INDENTED_STYLE) == \
        INDENTED_STYLE.dumps(FORMATS["llama3_json"].call_object(WEATHER))
