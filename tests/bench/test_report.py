"""The benchmark report on toy results: scoring, summary metrics, plots and the report page."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from toolspec.bench.analysis import (
    Run,
    history_label,
    off_format_comparison,
    read_run,
    same_output_speedup,
    step_accepted,
    tool_history,
)
from toolspec.bench.datasets import BenchItem
from toolspec.bench.main import main
from toolspec.bench.report import (
    NEAR_TIE_LOGITS,
    ReportConfigError,
    ReportDataset,
    divergence_rows,
    goal_rows,
    goals_for,
    load_config,
    plot_runs,
    report_markdown,
    step_end_shares,
    write_report,
)
from toolspec.bench.resume import read_item_results
from toolspec.bench.run import ItemResult, format_markdown, format_table, summarize
from toolspec.bench.scoring import adheres_to_format, calls_match, score_output, value_matches
from toolspec.bench.states import state_counts
from toolspec.calls.formats import ToolCall, get_format
from toolspec.calls.tools import ToolSet
from toolspec.core.engine import StepStats

TOOLS = ToolSet.from_functions([
    {"name": "weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "integer"},
        "flag": {"type": "string"}}}},
    {"name": "book", "parameters": {"type": "object", "properties": {
        "options": {"type": "object", "properties": {"size": {"type": "string"}}}}}},
])


def bfcl_item(answers: tuple, ordered: bool = False) -> BenchItem:
    return BenchItem("toy-0", ({"role": "user", "content": "?"},), (), TOOLS, None, answers,
                     ordered)


WEATHER = {"name": "weather", "arguments": {"city": ["San Francisco", "SF"], "unit": ["", "c"],
                                            "days": [3]}}


def test_calls_match_any_acceptable_value_and_optional_arguments() -> None:
    answer = (WEATHER,)
    assert calls_match([ToolCall("weather", {"city": "san francisco", "days": 3})], answer, TOOLS)
    assert calls_match([ToolCall("weather", {"city": "SF", "unit": "c", "days": 3.0})], answer)
    assert not calls_match([ToolCall("weather", {"city": "SF"})], answer)  # days is required
    assert not calls_match([ToolCall("weather", {"city": "LA", "days": 3})], answer)
    assert not calls_match([ToolCall("weather", {"city": "SF", "days": 3, "x": 1})], answer)
    assert not calls_match([ToolCall("book", {"city": "SF", "days": 3})], answer)
    assert not calls_match([], answer)


def test_parallel_calls_match_in_any_order_unless_ordered() -> None:
    la = {"name": "weather", "arguments": {"city": ["LA"], "days": [1]}}
    calls = [ToolCall("weather", {"city": "LA", "days": 1}),
             ToolCall("weather", {"city": "SF", "days": 3})]
    assert calls_match(calls, (WEATHER, la))
    assert not calls_match(calls, (WEATHER, la), ordered=True)
    assert calls_match(calls, (la, WEATHER), ordered=True)
    assert not calls_match(calls[:1] * 2, (WEATHER, la))


def test_values_nested_objects_and_string_typed_literals() -> None:
    assert value_matches({"size": "large"}, {"size": ["large", "L"]})  # acceptable values
    assert value_matches({"size": "large"}, {"size": "large"})  # a literal object
    assert value_matches([{"x": 1}], [{"x": [1, 2]}])
    assert not value_matches([1, 2], [1, 2, 3])
    assert not value_matches(True, 1) and not value_matches(1, True)
    assert value_matches("true", True, {"type": "string"})  # Java/JS values given as text
    assert not value_matches("true", True, {"type": "boolean"})
    assert value_matches("New-York, NY", "new york ny")


def test_format_adherence_and_wrappers() -> None:
    hermes, apibank = get_format("hermes"), get_format("apibank")
    call = '{"name": "weather", "arguments": {"city": "SF"}}'
    assert adheres_to_format(f"<tool_call>\n{call}\n</tool_call>", hermes, TOOLS, wrappers=True)
    two = f"<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call}\n</tool_call>"
    assert adheres_to_format(two, hermes, TOOLS, wrappers=True)
    fenced = f"```json\n{call}\n```"
    assert adheres_to_format(fenced, hermes, TOOLS)
    assert not adheres_to_format(fenced, hermes, TOOLS, wrappers=True)
    assert not adheres_to_format(call, apibank, TOOLS)  # API-Bank wants "parameters"
    block = '```<tool_call>\n{"name": "weather", "parameters": {"city": "SF"}}\n</tool_call>\n```'
    assert adheres_to_format(block, apibank, TOOLS, wrappers=True)
    assert not adheres_to_format('{"name": "nope", "arguments": {}}', hermes, TOOLS)
    assert not adheres_to_format("no call here", hermes, TOOLS)
    score = score_output(bfcl_item((WEATHER,)), fenced.replace('"SF"}', '"SF", "days": 3}'),
                         hermes)
    assert score.call_correct and score.format_adherent and not score.wrapped


def test_reference_calls_are_the_answer_when_an_item_has_no_acceptable_values() -> None:
    item = BenchItem("x", (), ({"name": "book", "arguments": {"options": {"size": "L"}}},), TOOLS)
    text = '{"name": "book", "arguments": {"options": {"size": "l"}}}'
    assert score_output(item, text, get_format("json")).call_correct
    assert not score_output(item, text.replace('"l"', '"M"'), get_format("json")).call_correct


class CharTokenizer:
    """One token per character (id = code point)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def step(accepted: int, emitted: int, sources: dict | None = None) -> StepStats:
    return StepStats(accepted + 1, accepted, emitted, 0.0, 0.0, 0.0, sources or {})


def test_state_counts_split_decode_tokens_into_drafted_and_not() -> None:
    text = '{"name": "weather", "arguments": {}}'
    tokens = [ord(c) for c in text]
    steps = [step(8, 9), step(0, 1)] + [step(0, 1)] * (len(tokens) - 11)
    written, drafted = state_counts(CharTokenizer(), tokens, steps, get_format("json"))
    assert sum(written.values()) == len(tokens) - 1
    assert sum(drafted.values()) == 8
    # The draft wrote `"name": ` : n, a, m, e and the closing quote inside the key string.
    assert drafted == {"call_start": 1, "call_key": 5, "call_colon": 2}


def result(item: str, method: str, text: str, decode_s: float, steps: int, decode_tokens: int,
           **extra) -> ItemResult:
    return ItemResult(item=item, method=method, tokens=[1] * (decode_tokens + 1), text=text,
                      new_tokens=decode_tokens + 1, decode_tokens=decode_tokens, steps=steps,
                      prefill_s=0.5, decode_s=decode_s,
                      accepted_by_source=extra.pop("by_source", {}),
                      identical_to_ar=True, first_difference=None, ar_margin=None, **extra)


def toy_results(items: int = 6) -> list[ItemResult]:
    out = []
    for i in range(items):
        tool = "weather" if i % 3 else "book"
        text = f'{{"name": "{tool}", "arguments": {{}}}}'
        scored = {"call_correct": i % 2 == 0, "format_adherent": True, "wrapped": False}
        out.append(result(f"it-{i}", "ar", text, 4.0, 20, 20, step_accepted=[0] * 20,
                          tokens_by_state={"text": 20}, drafted_by_state={}, **scored))
        out.append(result(f"it-{i}", "toolspec", text, 1.0 + i / 10, 5, 20,
                          step_accepted=[3, 2 + i % 2, 3, 4, 3],
                          tokens_by_state={"text": 5, "tool_name": 15},
                          drafted_by_state={"tool_name": 12, "text": 3},
                          by_source={"schema/name": 12, "suffix": 3}, **scored))
        out.append(result(f"it-{i}", "oracle", text, 0.5, 1, 20, step_accepted=[19],
                          by_source={"oracle": 19}, **scored))
    return out


def test_summary_reports_accuracy_adherence_states_and_oracle_fraction() -> None:
    summary = summarize(toy_results(), ["ar", "toolspec", "oracle"])
    assert summary["ar"]["call_accuracy"] == summary["toolspec"]["call_accuracy"] == 0.5
    assert summary["toolspec"]["format_adherence"] == 1.0
    assert summary["toolspec"]["wrapper_adherence"] == 0.0
    assert summary["oracle"]["oracle_fraction"] == 1.0
    assert summary["toolspec"]["oracle_fraction"] == pytest.approx(  # on e2e, not decode
        summary["toolspec"]["e2e_speedup"] / summary["oracle"]["e2e_speedup"])
    assert summary["toolspec"]["acceptance_by_state"]["tool_name"] == {
        "tokens": 90, "drafted": 72, "fraction": 0.8}
    assert "call acc" in format_table(summary)
    document = {"model": "m", "dtype": "fp32", "items": 6, "machine": "toy", "methods": summary}
    assert "| toolspec |" in format_markdown(document)


def test_old_items_read_without_the_new_fields(tmp_path: Path) -> None:
    old = {k: v for k, v in asdict(toy_results(1)[0]).items()
           if k not in ("call_correct", "format_adherent", "wrapped", "step_accepted",
                        "tokens_by_state", "drafted_by_state")}
    (tmp_path / "items.jsonl").write_text(json.dumps(old) + "\n")
    rows = read_item_results(tmp_path / "items.jsonl")
    assert rows[0].call_correct is None and rows[0].step_accepted is None
    summary = summarize(rows, ["ar"])
    assert summary["ar"]["call_accuracy"] is None and "oracle_fraction" not in summary["ar"]


def test_first_steps_and_tool_history_views() -> None:
    results = toy_results()
    assert step_accepted(results, "toolspec", 1) == [2, 3, 2, 3, 2, 3]
    assert step_accepted(results, "ar", 25) == []
    points = tool_history([results], "toolspec")
    # book: items 0, 3 (0 and 1 earlier calls); weather: 1, 2, 4, 5 (0, 1, 2, 3 earlier)
    assert [(p.earlier, p.items) for p in points] == [(0, 2), (1, 2), (2, 1), (3, 1)]
    assert all(p.mat == 4.0 for p in points)
    assert points[0].decode_speedup == pytest.approx((40 / 2.1) / (40 / 8))
    assert [history_label(b) for b in (0, 3, 20)] == ["0", "3-4", "20+"]


def write_run(directory: Path, results: list[ItemResult], name: str) -> Run:
    directory.mkdir(parents=True)
    methods = list(dict.fromkeys(r.method for r in results))
    document = {"model": "toy", "dtype": "fp32", "items": len({r.item for r in results}),
                "machine": "toy machine", "data": name, "methods": summarize(results, methods)}
    (directory / "results.json").write_text(json.dumps(document))
    (directory / "items.jsonl").write_text(
        "".join(json.dumps(asdict(r)) + "\n" for r in results))
    return read_run(directory)


def test_plots_and_report_page_are_written(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / "a", toy_results(), "a"),
            write_run(tmp_path / "b", [replace(r, decode_s=r.decode_s * 2)
                                       for r in toy_results(4)], "b")]
    images = plot_runs(runs, tmp_path / "png")
    assert [p.name for p in images] == ["speedup.png", "first_steps.png", "tool_history.png",
                                        "acceptance.png"]
    for image in images:
        assert image.read_bytes()[:4] == b"\x89PNG"
    page, images = write_report(runs, tmp_path / "docs", "make report")
    text = page.read_text()
    assert "`make report`" in text and "toy machine" in text
    assert "| a | 6 |" in text and "### b" in text
    assert all(f"(img/{image.name})" in text for image in images)
    assert (tmp_path / "docs" / "img" / "report_speedup.png").is_file()


def test_step_ends_are_the_undrafted_tokens_per_state() -> None:
    by_state = {"text": {"tokens": 10, "drafted": 9}, "value_string": {"tokens": 8, "drafted": 5},
                "tool_name": {"tokens": 4, "drafted": 4}}
    assert step_end_shares(by_state) == {"value_string": 0.75, "text": 0.25}
    assert step_end_shares({}) == {} == step_end_shares(None)
    summary = summarize(toy_results(), ["ar", "toolspec", "oracle"])
    assert step_end_shares(summary["toolspec"]["acceptance_by_state"]) == {
        "tool_name": 18 / 30, "text": 12 / 30}


def test_divergences_are_listed_with_their_near_tie_verdict() -> None:
    results = toy_results(3)
    results[1] = replace(results[1], identical_to_ar=False, first_difference=7,
                         ar_margin=NEAR_TIE_LOGITS / 4)
    results[4] = replace(results[4], identical_to_ar=False, first_difference=2, ar_margin=3.0)
    summary = summarize(results, ["ar", "toolspec", "oracle"])
    assert divergence_rows(summary) == [
        {"method": "toolspec", "item": "it-0", "position": 7,
         "ar_margin": NEAR_TIE_LOGITS / 4, "near_tie": True},
        {"method": "toolspec", "item": "it-1", "position": 2, "ar_margin": 3.0,
         "near_tie": False}]
    run = Run(name="toy", results=tuple(results),
              document={"model": "m", "dtype": "bf16", "items": 3, "machine": "toy",
                        "methods": {"ar": {}, "toolspec": {}, "oracle": {}}})
    text = report_markdown([run], [], "make report")
    assert "2 of 6 outputs differ from ar's; 1 of them" in text
    assert "| toy | toolspec | it-1 | 2 | 3.000 | no |" in text
    clean = replace(run, results=tuple(toy_results(3)))
    assert "None: all 6 outputs equal ar's" in report_markdown([clean], [], "make report")


def test_goal_rows_compare_toolspec_with_the_best_baseline_end_to_end() -> None:
    summary = {"ar": {"decode_speedup": 1.0, "e2e_speedup": 1.0},
               "pld": {"decode_speedup": 1.5, "e2e_speedup": 1.4},
               "suffix": {"decode_speedup": 2.0, "e2e_speedup": 1.6},
               "toolspec": {"decode_speedup": 4.0, "e2e_speedup": 3.2},
               "oracle": {"decode_speedup": 8.0, "e2e_speedup": 4.0}}
    assert goal_rows(summary) == pytest.approx({"e2e_vs_ar": 3.2, "e2e_vs_best_baseline": 2.0,
                                                "decode_vs_ar": 4.0, "oracle_fraction": 0.8})
    assert goal_rows({"ar": {"decode_speedup": 1.0, "e2e_speedup": 1.0}})["e2e_vs_ar"] is None
    del summary["oracle"]
    assert goal_rows(summary)["oracle_fraction"] is None
    bfcl = ReportDataset("simple", "bfcl:simple_python")
    other = ReportDataset("mine", "traffic.jsonl")
    assert goals_for(bfcl) == {"e2e_vs_ar": 3.0, "e2e_vs_best_baseline": 1.7,
                               "decode_vs_ar": 5.0}
    assert goals_for(other) == {"e2e_vs_ar": 3.0, "e2e_vs_best_baseline": 1.5}


def test_tokens_accepted_in_the_prompts_forward_are_prefills() -> None:
    """An item whose first tree rode on the prompt's forward and delivered 10 of its 20 tokens:
    decode counts the 9 after the first forward (20 minus the first token minus 10), MAT only
    the decoding steps, and ``prefill_accepted`` the 10."""
    base = result("it-0", "ar", "x", 4.0, 19, 19)
    fast = replace(result("it-0", "toolspec", "x", 0.9, 3, 19), prefill_accepted=10)
    summary = summarize([base, fast], ["ar", "toolspec"])
    entry = summary["toolspec"]
    assert fast.after_first_forward == 9
    assert entry["prefill_accepted"] == 10
    assert entry["decode_tokens_per_s"] == pytest.approx(9 / 0.9)
    assert entry["mat"] == pytest.approx(9 / 3)
    assert entry["decode_speedup"] == pytest.approx((9 / 0.9) / (19 / 4.0))
    assert entry["e2e_speedup"] > 1 and entry["ttft_s"] == fast.prefill_s


def test_an_accepted_end_token_at_prefill_is_no_output_token() -> None:
    """A whole 20-token output riding on the prompt's forward: its tree accepted the 19 tokens
    after the first and the end token (20 accepted). The decode phase emitted nothing; it must
    not count -1 tokens (which turned the oracle's decode speed-up negative)."""
    whole = replace(result("it-0", "oracle", "x", 0.0, 0, 19), prefill_accepted=20)
    assert (whole.prefill_emitted, whole.after_first_forward) == (19, 0)
    assert whole.verification_counts() == (0, 0)
    entry = summarize([result("it-0", "ar", "x", 4.0, 19, 19), whole], ["ar", "oracle"])["oracle"]
    assert entry["prefill_accepted"] == 19 and entry["after_first_forward"] == 0
    assert entry["decode_tokens_per_s"] == 0.0 and entry["mat"] == 0.0
    # Its decode speed-up is no figure: the report shows – for it, and its e2e speed-up.
    run = Run("toy", {"model": "m", "dtype": "bf16", "items": 1, "machine": "toy",
                      "methods": {"ar": {}, "oracle": {}}},
              (result("it-0", "ar", "x", 4.0, 19, 19), whole))
    decode_table = report_markdown([run], [], "make report").split("## Decode speed-up")[1]
    assert "| toy | 1 | – | 1.00× | – |" in decode_table


def test_the_report_says_which_sets_were_tuned_on() -> None:
    run = Run(name="l1", results=tuple(toy_results(2)),
              document={"model": "m", "dtype": "bf16", "items": 2, "machine": "toy",
                        "methods": {"ar": {}, "toolspec": {}, "oracle": {}}})
    datasets = [ReportDataset("l1", "apibank:level-1", dev_items=200)]
    text = report_markdown([run], [], "make report", datasets=datasets)
    assert "## End-to-end speed-up vs plain decoding" in text
    assert text.index("End-to-end speed-up") < text.index("Decode speed-up vs")
    assert "| l1 | 2 | first 200 tuned on, left out |" in text
    assert ReportDataset("l2", "x", tuned=True).tuning == "tuned on: not a result"
    assert ReportDataset("live", "bfcl:live_simple").tuning == "never tuned on"


def test_report_config_and_the_cli_from_existing_runs(tmp_path: Path, capsys) -> None:
    write_run(tmp_path / "runs" / "fp32" / "toy-a", toy_results(), "toy-a")  # a folder a dtype
    config = tmp_path / "report.toml"
    config.write_text(f'model = "toy"\ndtype = "fp32"\nmethods = "ar,toolspec,oracle"\n'
                      f'out = "{tmp_path / "runs"}"\ndocs = "{tmp_path / "docs"}"\n'
                      f'[[datasets]]\nname = "toy-a"\ndata = "bfcl:simple_python"\nlimit = 50\n')
    loaded = load_config(config)
    assert loaded.limited(5).datasets[0].limit == 5
    assert loaded.limited(500).datasets[0].limit == 50
    assert main(["bench", "report", "--config", str(config), "--no-run",
                 "--command-line", "make report LIMIT=2"]) == 0
    assert "make report LIMIT=2" in (tmp_path / "docs" / "report-fp32.md").read_text()
    assert main(["bench", "plot", str(tmp_path / "runs" / "fp32" / "toy-a"),
                 "--out", str(tmp_path / "png"), "--prefix", "x_"]) == 0
    assert (tmp_path / "png" / "x_first_steps.png").is_file()
    assert main(["bench", "plot", str(tmp_path), "--out", str(tmp_path / "png")]) == 2
    assert "needs results.json" in capsys.readouterr().err
    assert loaded.prepack_linear
    config.write_text(config.read_text().replace('model = "toy"',
                                                 'model = "toy"\nprepack_linear = false'))
    assert not load_config(config).prepack_linear
    assert not load_config(config).exact_bf16
    config.write_text(config.read_text().replace('model = "toy"',
                                                 'model = "toy"\nexact_bf16 = true'))
    assert load_config(config).exact_bf16
    config.write_text(config.read_text().replace("exact_bf16 = true", 'exact_bf16 = "yes"'))
    with pytest.raises(ReportConfigError, match="exact_bf16 must be true or false"):
        load_config(config)
    config.write_text(config.read_text().replace('exact_bf16 = "yes"\n', ""))
    for bad in ('"no"', "0", "[8, 16]"):
        config.write_text(config.read_text().replace("prepack_linear = false",
                                                     f"prepack_linear = {bad}"))
        with pytest.raises(ReportConfigError, match="prepack_linear"):
            load_config(config)
        config.write_text(config.read_text().replace(f"prepack_linear = {bad}",
                                                     "prepack_linear = false"))
    config.write_text(config.read_text().replace("prepack_linear = false", "packed_rows = [8]"))
    with pytest.raises(ReportConfigError, match="packed_rows is gone"):  # the old knob
        load_config(config)
    config.write_text('methods = "ar"\n')
    with pytest.raises(ReportConfigError, match="missing"):
        load_config(config)


def test_same_output_speedup_counts_only_items_both_methods_reproduce() -> None:
    runs = [
        result("a", "suffix", "x", 2.5, 5, 20), result("a", "toolspec", "x", 1.5, 4, 20),
        # suffix wandered off into a shorter, easier text here: left out
        replace(result("b", "suffix", "y", 0.5, 2, 20), identical_to_ar=False),
        result("b", "toolspec", "x", 1.5, 4, 20),
        result("c", "toolspec", "x", 1.0, 4, 20),  # suffix did not run it
    ]
    same = same_output_speedup(runs, "toolspec", "suffix")
    assert (same.items, same.of) == (1, 2)
    assert same.speedup == pytest.approx((0.5 + 2.5) / (0.5 + 1.5))
    assert same_output_speedup(runs[2:], "toolspec", "suffix").speedup is None


def test_goal_table_shows_the_same_outputs_ratio_against_the_best_baseline() -> None:
    results = [*toy_results(2),
               result("it-0", "suffix", "t", 2.0, 10, 20),
               result("it-1", "suffix", "t", 2.0, 10, 20)]
    run = Run("toy", {"model": "m", "dtype": "bf16", "items": 2, "machine": "toy",
                      "methods": {"ar": {}, "suffix": {}, "toolspec": {}}}, tuple(results))
    text = report_markdown([run], [], "make report")
    # toolspec: 0.5 + 1.0 and 0.5 + 1.1 s; suffix 2.5 s twice
    assert f"{5.0 / 3.1:.2f}× (2/2)" in text


def test_off_format_items_compare_toolspec_with_the_baseline_where_ar_left_the_format() -> None:
    off = {"format_adherent": False}
    results = [
        result("a", "ar", "prose", 4.0, 20, 20, **off),
        result("a", "suffix", "prose", 2.0, 8, 20, **off),
        result("a", "toolspec", "prose", 1.5, 6, 20, by_source={"suffix": 9, "retrieval": 5},
               **off),
        result("b", "ar", "call", 4.0, 20, 20, format_adherent=True),
        result("b", "suffix", "call", 2.0, 8, 20, format_adherent=True),
        result("b", "toolspec", "call", 0.5, 2, 20, by_source={"schema/name": 18},
               format_adherent=True),
        result("c", "ar", "old", 4.0, 20, 20),  # scored before adherence existed: left out
        result("c", "suffix", "old", 2.0, 8, 20), result("c", "toolspec", "old", 1.0, 4, 20),
    ]
    comparison = off_format_comparison(results, "toolspec", "suffix")
    assert (comparison.items, comparison.of) == (1, 3)
    assert comparison.speedup == pytest.approx((0.5 + 2.0) / (0.5 + 1.5))
    assert (comparison.mat, comparison.other_mat) == (20 / 6, 20 / 8)
    assert comparison.source_shares == {"suffix": 9 / 21, "retrieval": 5 / 21}
    assert off_format_comparison(results[3:], "toolspec", "suffix").speedup is None
    run = Run("toy", {"model": "m", "dtype": "bf16", "items": 3, "machine": "toy",
                      "methods": {"ar": {}, "suffix": {}, "toolspec": {}}}, tuple(results))
    text = report_markdown([run], [], "make report")
    assert "## Where plain decoding leaves the call format" in text
    assert f"| toy | 1/3 | suffix | {2.5 / 2.0:.2f}× | 3.33 | 2.50 | suffix 43%, retrieval 24% |" \
        in text
