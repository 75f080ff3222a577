"""The benchmark harness end to end on real weights (SmolLM2-135M, fp32), and its pieces."""

import json
from pathlib import Path

import pytest
import torch

from toolspec.bench.datasets import DatasetFormatError, load_apibank, sample_path
from toolspec.bench.main import main
from toolspec.bench.methods import UnknownMethodError, parse_methods
from toolspec.bench.run import first_difference, linear_kernels
from toolspec.model.machine import describe_machine


def test_methods_always_start_with_the_reference() -> None:
    assert parse_methods("pld,oracle") == ["ar", "pld", "oracle"]
    assert parse_methods("oracle,ar,oracle") == ["ar", "oracle"]
    with pytest.raises(UnknownMethodError, match="available: ar, pld, oracle"):
        parse_methods("ar,medusa")


def test_a_method_may_carry_a_fixed_budget_of_its_own() -> None:
    from toolspec.bench.methods import split_budget

    assert split_budget("toolspec@7") == ("toolspec", 7)
    assert split_budget("toolspec") == ("toolspec", None)
    assert parse_methods("toolspec,toolspec@7") == ["ar", "toolspec", "toolspec@7"]
    for bad in ("toolspec@", "toolspec@0", "toolspec@x", "ar@4"):
        with pytest.raises(UnknownMethodError, match="whole number of draft nodes"):
            parse_methods(bad)
    with pytest.raises(UnknownMethodError, match="unknown method"):
        parse_methods("medusa@4")


def test_engines_of_a_run_size_trees_by_the_run_budget_or_their_own() -> None:
    import torch
    from helpers import ToyTokenizer, tiny_model

    from toolspec.bench.run import build_engines
    from toolspec.core.budget import CostAwareBudget, CostModel, FixedBudget
    from toolspec.model.loading import LoadedModel

    loaded = LoadedModel("tiny", tiny_model("qwen2", vocab_size=64), ToyTokenizer(),  # type: ignore[arg-type]
                         torch.float32, torch.device("cpu"))
    methods = ["ar", "pld", "pld@3"]
    by_curve = build_engines(loaded, methods, cost=CostModel.linear(0.1))
    assert isinstance(by_curve["pld"].budget, CostAwareBudget)
    assert isinstance(by_curve["pld@3"].budget, FixedBudget)
    assert by_curve["pld@3"].budget.max_nodes == 3
    capped = build_engines(loaded, methods, fixed_budget=5)
    assert [capped[m].budget.max_nodes for m in methods] == [5, 5, 3]


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_apibank_loader_reads_single_and_multi_call_answers(tmp_path: Path) -> None:
    items = load_apibank(sample_path())
    assert len(items) == 5
    assert items[0].messages[0]["role"] == "system"
    assert items[0].reference_calls[0]["name"] == "ModifyRegistration"
    single = tmp_path / "single.json"
    single.write_text(json.dumps([{"system": "s", "user": "u",
                                   "answer": {"name": "T", "parameters": {"a": 1}}}]))
    assert load_apibank(single)[0].reference_calls == ({"name": "T", "arguments": {"a": 1}},)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{"system": "s"}]))
    with pytest.raises(DatasetFormatError, match=r"broken.json\[0\]: missing user, answer"):
        load_apibank(broken)


@pytest.mark.real_model
def test_report_runs_its_data_sets_then_writes_the_page(tmp_path: Path, capsys) -> None:
    """``toolspec bench report`` without ``--no-run``: every data set benchmarked with the
    config's options (weight packing included) into a folder of the dtype it ran in, then the
    Markdown page."""
    config = tmp_path / "report.toml"

    def write_config(max_new_tokens: int) -> None:
        config.write_text(f'model = "smollm2-135m"\ndtype = "bf16"\nmethods = "ar,pld"\n'
                          f'max_new_tokens = {max_new_tokens}\nprepack_linear = false\n'
                          f'out = "{tmp_path / "runs"}"\ndocs = "{tmp_path / "docs"}"\n'
                          f'[[datasets]]\nname = "sample"\ndata = "{sample_path()}"\nlimit = 3\n')

    write_config(12)
    assert main(["bench", "report", "--config", str(config), "--limit", "1",
                 "--dtype", "fp32"]) == 0
    run = tmp_path / "runs" / "fp32" / "sample"
    results = json.loads((run / "results.json").read_text())
    assert results["items"] == 1 and results["prepacked_linear"] is False
    assert results["dtype"] == "fp32"  # --dtype overrides the config's
    assert set(results["methods"]) == {"ar", "pld"}
    assert "sample" in (tmp_path / "docs" / "report-fp32.md").read_text()
    # Other settings would mix results into the run: refused, nothing lost.
    write_config(16)
    assert main(["bench", "report", "--config", str(config), "--limit", "1",
                 "--dtype", "fp32"]) == 2
    assert "max_new_tokens 12 (this run: 16)" in capsys.readouterr().err
    assert json.loads((run / "results.json").read_text()) == results


@pytest.mark.real_model
def test_report_exact_bf16_runs_apart_with_its_own_methods(tmp_path: Path, capsys) -> None:
    """``--exact-bf16 --methods``: the config's data sets with other methods and exact bf16,
    into folders and a page of their own (they round apart from default bf16 runs)."""
    from toolspec.model.packed_linear import exact_tiles_available

    config = tmp_path / "report.toml"
    config.write_text(f'model = "smollm2-135m"\ndtype = "bf16"\nmethods = "ar,pld,suffix"\n'
                      f'max_new_tokens = 10\nout = "{tmp_path / "runs"}"\n'
                      f'docs = "{tmp_path / "docs"}"\n'
                      f'[[datasets]]\nname = "sample"\ndata = "{sample_path()}"\n')
    assert main(["bench", "report", "--config", str(config), "--limit", "1", "--exact-bf16",
                 "--methods", "ar,pld"]) == 0
    run = tmp_path / "runs" / "bf16-exact" / "sample"
    results = json.loads((run / "results.json").read_text())
    assert set(results["methods"]) == {"ar", "pld"}
    settings = json.loads((run / "run.json").read_text())
    assert settings["exact_bf16"] is exact_tiles_available(torch.device("cpu"), torch.bfloat16)
    assert "sample" in (tmp_path / "docs" / "report-bf16-exact.md").read_text()
    assert not (tmp_path / "runs" / "bf16").exists()
    assert main(["bench", "report", "--config", str(config), "--methods", "ar,nope"]) == 2
    assert "unknown method(s) nope" in capsys.readouterr().err


@pytest.mark.real_model
def test_bench_cli_writes_the_documented_results(tmp_path: Path, capsys) -> None:
    code = main(["bench", "--model", "smollm2-135m", "--dtype", "fp32",
                 "--data", str(sample_path()), "--limit", "2",
                 "--methods", "ar,pld,oracle,oracle@2", "--max-new-tokens", "24",
                 "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"model", "dtype", "items", "machine", "methods"} <= results.keys()
    assert results["model"] == "smollm2-135m" and results["dtype"] == "fp32"
    assert results["items"] == 2
    for name in ("ar", "pld", "oracle"):
        method = results["methods"][name]
        for field in ("decode_tokens_per_s", "e2e_tokens_per_s", "mat", "decode_speedup",
                      "e2e_speedup", "identical_to_ar", "steps", "new_tokens"):
            assert field in method, (name, field)
        assert method["identical_to_ar"] == 1.0  # fp32: exact
    assert results["methods"]["ar"]["mat"] == 1.0
    assert results["methods"]["ar"]["decode_speedup"] == 1.0
    # The auto budget's curve is recorded, and a replay can size its trees to it.
    from toolspec.core.budget import CostModel
    assert results["cost_curve"]["1"] == 1.0
    assert CostModel.load(tmp_path / "results.json").cost(64) == results["cost_curve"]["64"]
    # The uncapped oracle's whole output rides on the prompt's forward: prefill's tokens, so
    # no decode phase to speak of; its speed-up shows end to end.
    oracle = results["methods"]["oracle"]
    assert oracle["prefill_accepted"] == oracle["new_tokens"] - 2 and oracle["steps"] == 0
    assert oracle["e2e_speedup"] > 1.5 and oracle["oracle_fraction"] == 1.0
    # Side by side in the same run, the oracle capped at 2 nodes a step: at most 3 tokens each.
    assert 1 < results["methods"]["oracle@2"]["mat"] <= 3
    assert results["methods"]["oracle@2"]["identical_to_ar"] == 1.0
    lines = [line for line in (tmp_path / "items.jsonl").read_text().splitlines()
             if json.loads(line)["method"] != "oracle@2"]
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    assert len(lines) == 6
    assert "e2e x" in capsys.readouterr().out

    # Interrupted after item 1 with item 2 half done: a rerun keeps item 1, reruns item 2.
    (tmp_path / "items.jsonl").write_text("\n".join(lines[:4]) + "\n")
    assert main(["bench", "--model", "smollm2-135m", "--dtype", "fp32",
                 "--data", str(sample_path()), "--limit", "2", "--methods", "ar,pld,oracle",
                 "--max-new-tokens", "24", "--out", str(tmp_path)]) == 0
    assert "resuming: 1 items" in capsys.readouterr().out
    resumed = (tmp_path / "items.jsonl").read_text().splitlines()
    assert resumed[:3] == lines[:3] and len(resumed) == 6
    assert [json.loads(line)["tokens"] for line in resumed] == \
        [json.loads(line)["tokens"] for line in lines]
    assert json.loads((tmp_path / "results.json").read_text())["items"] == 2

    # A shorter run into the same folder summarises its own item and deletes nothing.
    assert main(["bench", "--model", "smollm2-135m", "--dtype", "fp32",
                 "--data", str(sample_path()), "--limit", "1", "--methods", "ar,pld",
                 "--max-new-tokens", "24", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "items.jsonl").read_text().splitlines() == resumed
    short = json.loads((tmp_path / "results.json").read_text())
    assert short["items"] == 1 and set(short["methods"]) == {"ar", "pld"}
    from toolspec.bench.analysis import read_run
    assert [(r.item, r.method) for r in read_run(tmp_path).results] == \
        [(json.loads(line)["item"], json.loads(line)["method"]) for line in resumed[:2]]
    # Other settings would mix results: refused.
    assert main(["bench", "--model", "smollm2-135m", "--dtype", "fp32",
                 "--data", str(sample_path()), "--limit", "1", "--methods", "ar,pld",
                 "--max-new-tokens", "16", "--out", str(tmp_path)]) == 2
    assert "max_new_tokens 24 (this run: 16)" in capsys.readouterr().err


@pytest.mark.real_model
def test_cost_curve_cli(tmp_path: Path, capsys) -> None:
    assert main(["bench", "cost-curve", "--model", "smollm2-135m", "--dtype", "fp32",
                 "--prefix", "32", "--max-k", "4", "--repeats", "1", "--out", str(tmp_path)]) == 0
    curve = json.loads((tmp_path / "cost_curve.json").read_text())
    assert list(curve["relative"]) == ["1", "2", "3", "4"] and curve["relative"]["1"] == 1.0
    assert "x k=1" in capsys.readouterr().out


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys) -> None:
    assert main(["bench", "--data", str(tmp_path / "nope.json"), "--model", "smollm2-135m"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["bench", "--data", str(sample_path()), "--methods", "ar,nope"]) == 2


def test_growth_series_from_sim_reports_and_bench_items(tmp_path: Path, capsys) -> None:
    from toolspec.bench.growth import GrowthInputError, growth_points, read_series

    report = {"drafter": "toolspec", "per_item": [
        {"id": str(i), "steps": 10, "emitted": 20 + 10 * i, "library_calls": i} for i in range(5)]}
    (tmp_path / "sim.json").write_text(json.dumps(report))
    rows = [{"item": "a", "method": m, "steps": 4, "decode_tokens": 8, "library_calls": 0}
            for m in ("ar", "toolspec")]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    series = read_series(tmp_path / "sim.json")
    assert series == {"toolspec": [(i, 10, 20 + 10 * i) for i in range(5)]}
    points = growth_points(series["toolspec"], window=2)
    assert [(p.library_calls, p.mat, p.items) for p in points] == \
        [(0.5, 2.5, 2), (2.5, 4.5, 2), (4.0, 6.0, 1)]
    assert set(read_series(tmp_path / "items.jsonl")) == {"ar", "toolspec"}
    (tmp_path / "bare.json").write_text(json.dumps({"per_item": []}))
    with pytest.raises(GrowthInputError, match="bare.json"):
        read_series(tmp_path / "bare.json")
    assert main(["bench", "growth", str(tmp_path / "sim.json"), str(tmp_path / "items.jsonl"),
                 "--window", "2", "--plot", str(tmp_path / "growth.png")]) == 0
    assert (tmp_path / "growth.png").stat().st_size > 1000
    assert "toolspec: 0 calls → MAT 2.50" in capsys.readouterr().out


def test_the_machine_line_names_the_cpu_kernel_level() -> None:
    """Cost curves are cached per machine line: two CPUs of one model name but different
    instruction sets (bf16 native vs emulated) must not share one."""
    line = describe_machine(torch.device("cpu"))
    assert f"({torch.backends.cpu.get_cpu_capability()}" in line
    assert f"torch {torch.__version__}" in line


def test_documents_say_how_their_linear_layers_ran() -> None:
    assert linear_kernels({"dtype": "fp32", "prepacked_linear": True}) == \
        "linear weights prepacked for oneDNN"
    assert linear_kernels({"dtype": "fp32", "prepacked_linear": False}) == "stock linear kernels"
    assert linear_kernels({"dtype": "fp32", "packed_rows": [8, 16]}) == \
        "linear weights packed for 8/16 rows (MKL)"  # runs recorded before oneDNN packing
    assert linear_kernels({"dtype": "bf16", "prepacked_linear": False}) == ""


@pytest.mark.real_model
def test_bench_concurrency_writes_the_curve_and_fp32_outputs_stay_exact(tmp_path: Path,
                                                                         capsys) -> None:
    code = main(["bench", "--model", "smollm2-135m", "--dtype", "fp32", "--budget", "6",
                 "--data", str(sample_path()), "--limit", "4", "--methods", "ar,toolspec",
                 "--max-new-tokens", "20", "--concurrency", "1,3", "--out", str(tmp_path)])
    assert code == 0
    document = json.loads((tmp_path / "concurrency.json").read_text())
    assert set(document["levels"]) == {"ar", "toolspec"}
    for method in ("ar", "toolspec"):
        assert set(document["levels"][method]) == {"1", "3"}
        for row in document["levels"][method].values():
            assert row["items"] == 4 and row["completion_tokens_per_s"] > 0
            assert row["identical_to_ar"] == 1.0  # batched fp32 decoding is plain decoding's
    assert (tmp_path / "concurrency.png").stat().st_size > 0
