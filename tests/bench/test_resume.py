"""Resumable bench folders: what a rerun keeps, what it runs again, what it refuses."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from toolspec.bench.analysis import read_run
from toolspec.bench.resume import (
    ITEMS_FILE,
    ResultLog,
    ResumeMismatchError,
    claim_folder,
    measuring_code_digest,
    read_item_results,
)
from toolspec.bench.run import ItemResult, summarize


def result(item: str, method: str, decode_s: float = 1.0) -> ItemResult:
    return ItemResult(item=item, method=method, tokens=[1, 2, 3], text="t", new_tokens=3,
                      decode_tokens=2, steps=2, prefill_s=0.1, decode_s=decode_s,
                      accepted_by_source={}, identical_to_ar=True, first_difference=None,
                      ar_margin=None)


def write_log(path: Path, results: list[ItemResult]) -> None:
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))


def keys(path: Path) -> list[tuple[str, str]]:
    return [(r.item, r.method) for r in read_item_results(path)]


def test_a_rerun_keeps_what_it_does_not_replace(tmp_path: Path) -> None:
    log_path = tmp_path / ITEMS_FILE
    # a: finished with ar, pld, oracle; b: interrupted after ar; c: outside the rerun's --limit.
    write_log(log_path, [result("a", "ar"), result("a", "pld"), result("a", "oracle"),
                         result("b", "ar"), result("c", "ar"), result("c", "pld")])
    with ResultLog(log_path, ["a", "b"], ["ar", "pld"]) as log:
        assert set(log.finished) == {"a"} and list(log.finished["a"]) == ["ar", "pld"]
        # b is run again from ar, so its earlier (unpaired) ar result is gone already.
        assert ("b", "ar") not in keys(log_path)
        # As run_items yields them: a's from ``finished`` (in the file already), b's anew.
        for done in log.finished["a"].values():
            log.record(done)
        log.record(result("b", "ar", 2.0))
        log.record(result("b", "pld", 2.0))
    assert keys(log_path) == [("a", "ar"), ("a", "pld"), ("a", "oracle"), ("c", "ar"),
                              ("c", "pld"), ("b", "ar"), ("b", "pld")]
    assert [r.decode_s for r in read_item_results(log_path) if r.item == "b"] == [2.0, 2.0]


def test_a_line_cut_short_by_a_kill_is_run_again(tmp_path: Path) -> None:
    log_path = tmp_path / ITEMS_FILE
    write_log(log_path, [result("a", "ar"), result("a", "pld"), result("b", "ar")])
    log_path.write_text(log_path.read_text()[:-40])  # b's line ends mid-record
    with ResultLog(log_path, ["a", "b"], ["ar", "pld"]) as log:
        assert set(log.finished) == {"a"}
    assert keys(log_path) == [("a", "ar"), ("a", "pld")]
    log_path.write_text('{"cut\n' + log_path.read_text())  # not the last line: a broken file
    with pytest.raises(json.JSONDecodeError):
        read_item_results(log_path)


def test_a_missing_method_runs_the_item_again(tmp_path: Path) -> None:
    log_path = tmp_path / ITEMS_FILE
    write_log(log_path, [result("a", "ar"), result("a", "pld")])
    with ResultLog(log_path, ["a"], ["ar", "pld", "suffix"]) as log:
        assert log.finished == {}
    assert keys(log_path) == []  # its earlier results were timed against the ar run now redone


def test_the_summary_reads_back_only_its_items_and_methods(tmp_path: Path) -> None:
    """A short run into the folder of a longer one: the file keeps both, the run reads its own."""
    write_log(tmp_path / ITEMS_FILE, [result("c", "ar"), result("c", "pld"), result("b", "ar"),
                                      result("b", "pld"), result("b", "oracle"),
                                      result("a", "ar"), result("a", "pld")])
    mine = [r for r in read_item_results(tmp_path / ITEMS_FILE)
            if r.item in ("a", "b") and r.method in ("ar", "pld")]
    document = {"model": "toy", "items": 2, "item_ids": ["a", "b"],
                "methods": summarize(mine, ["ar", "pld"])}
    (tmp_path / "results.json").write_text(json.dumps(document))
    run = read_run(tmp_path)
    assert [(r.item, r.method) for r in run.results] == [("a", "ar"), ("a", "pld"),
                                                         ("b", "ar"), ("b", "pld")]
    del document["item_ids"]  # a summary written before item_ids: every result of its methods
    (tmp_path / "results.json").write_text(json.dumps(document))
    assert len(read_run(tmp_path).results) == 6


def test_a_folder_refuses_results_measured_otherwise(tmp_path: Path) -> None:
    settings = {"model": "m", "dtype": "bf16", "data": "bfcl:multiple", "max_new_tokens": 192,
                "draft_budget": "auto", "library": None}
    claim_folder(tmp_path / "run", settings)
    claim_folder(tmp_path / "run", dict(settings))  # the same settings resume
    with pytest.raises(ResumeMismatchError, match=r"dtype 'bf16' \(this run: 'fp32'\).*another "
                                                  r"--out"):
        claim_folder(tmp_path / "run", {**settings, "dtype": "fp32"})
    with pytest.raises(ResumeMismatchError, match=r"tenant None \(this run: 'a'\)"):
        claim_folder(tmp_path / "run", {**settings, "tenant": "a"})
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == settings
    (tmp_path / "old").mkdir()
    write_log(tmp_path / "old" / ITEMS_FILE, [result("a", "ar")])
    claim_folder(tmp_path / "old", settings)  # a folder from before run.json: taken as is
    assert (tmp_path / "old" / "run.json").is_file()


def test_the_code_digest_follows_measuring_modules_only(tmp_path: Path) -> None:
    package = tmp_path / "toolspec"
    (package / "bench").mkdir(parents=True)
    (package / "engine.py").write_text("STEP = 1\n")
    (package / "bench" / "report.py").write_text("TITLE = 'a'\n")
    before = measuring_code_digest(package)
    (package / "bench" / "report.py").write_text("TITLE = 'b'\n")  # presentation only
    assert measuring_code_digest(package) == before
    (package / "engine.py").write_text("STEP = 2\n")
    assert measuring_code_digest(package) != before
    assert len(measuring_code_digest()) == 16  # the installed package's


@pytest.mark.real_model
def test_a_resumed_run_drafts_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """Drafters and budgets that learn across items relearn the finished items' outputs, so
    the items a resumed run decodes get the trees an uninterrupted run would have given them."""
    from toolspec.bench.datasets import load_apibank, sample_path
    from toolspec.bench.methods import parse_methods
    from toolspec.bench.run import build_engines, run_items
    from toolspec.core.budget import CostModel
    from toolspec.core.engine import GenerationParams
    from toolspec.library import CallLibrary
    from toolspec.model.loading import load_model

    loaded = load_model("smollm2-135m", dtype="fp32", prepack_linear=False)
    items = load_apibank(sample_path())[:3]
    methods = parse_methods("toolspec")  # its drafter learns its suffix fallback's outputs too
    params = GenerationParams(max_new_tokens=24)
    cost = CostModel.linear(0.05)

    def run(run_these: list, finished: dict, library_dir: Path) -> list[ItemResult]:
        engines = build_engines(loaded, methods, cost=cost)
        with CallLibrary(library_dir) as library:
            return list(run_items(engines, loaded.tokenizer, run_these, methods, params,
                                  progress=False, library=library, finished=finished))

    def drafting(results: list[ItemResult]) -> list[tuple]:
        return [(r.method, r.tokens, r.step_accepted, r.accepted_by_source) for r in results
                if r.item == items[2].id]

    whole = run(items, {}, tmp_path / "whole")
    done = {item.id: {r.method: r for r in whole if r.item == item.id} for item in items[:2]}
    resumed = run(items, done, tmp_path / "resumed")
    assert drafting(resumed) == drafting(whole)
    # What made that worth checking: with nothing learned before it, the item drafts otherwise.
    assert drafting(run(items[2:], {}, tmp_path / "alone")) != drafting(whole)
