"""The load scripts' arithmetic (no server): what ``load_tests/concurrency.py``,
``load_tests/autoscale.py`` and ``load_tests/guidellm_bench.py`` report from what they recorded,
and the requests GuideLLM is given."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from helpers import REPO

sys.path.insert(0, str(REPO / "load_tests"))

from autoscale import summarize as summarize_autoscale  # noqa: E402
from concurrency import RequestRecord, goals, mode_config, summarize  # noqa: E402

from toolspec.bench.datasets import apibank_file  # noqa: E402


def record(started: float, ttft: float, latency: float, tokens: int, prompt: int, cached: int,
           decode_rows: int, tools: str, status: int = 200) -> RequestRecord:
    return RequestRecord("toolspec", 1, started, ttft, latency, tokens, 3.0, status, prompt,
                         cached, prompt - cached, decode_rows, tools)


def test_a_levels_summary_counts_rows_cache_hits_and_inter_token_latency() -> None:
    records = [record(0.0, 1.0, 3.0, 21, 400, 0, 60, "a"),
               record(3.0, 0.5, 1.5, 11, 420, 384, 30, "a"),
               record(4.5, 2.0, 2.0, 1, 300, 0, 1, "b"),
               record(5.0, 0.1, 0.2, 0, 100, 0, 0, "c", status=500)]
    summary = summarize(records)
    assert summary["requests"] == 4 and summary["failed"] == 1
    assert summary["cached_prompt_share"] == 384 / 1120
    assert summary["prompt_row_share"] == (400 + 36 + 300) / (400 + 36 + 300 + 91)
    # Per request, the time after the first fragment over the tokens after the first.
    assert summary["inter_token_p50_s"] == 0.1 and summary["inter_token_p99_s"] == 0.1
    assert summary["repeated_tools_ttft_p50_s"] == 0.5  # the second request of tool set "a"
    assert summary["completion_tokens_per_s"] == 33 / 6.5


def test_each_mode_deploys_the_config_with_only_its_drafting_changed() -> None:
    """Plain decoding: vLLM's engine without a speculative method (a reload), the project's
    engine with no draft budget (in place); both with fixed replicas and no autoscaling."""
    import yaml

    def deployed(engine: str, draft_budget: int | str) -> tuple[dict, dict]:
        document = yaml.safe_load((REPO / "serve_config.yaml").read_text())
        document["applications"][0]["args"]["model"]["engine"] = engine
        (app,) = mode_config(document, draft_budget, replicas=2)["applications"]
        (server,) = [d for d in app["deployments"] if d["name"] == "ModelServer"]
        return app["args"]["model"], server["user_config"]

    model, user_config = deployed("vllm", 0)
    assert user_config["speculative_method"] == "none" and "autoscaling" not in model
    assert model["replicas"] == 2 and model["routing"] == "prefix_aware"
    assert deployed("vllm", "auto")[1]["speculative_method"] == model["speculative_method"]
    assert deployed("toolspec", 0)[1]["draft_budget"] == 0
    assert deployed("toolspec", "auto")[1]["draft_budget"] == "auto"


def test_goals_read_the_levels_they_need() -> None:
    level = {"prompt_row_share": 0.5, "cached_prompt_share": 0.7, "completion_tokens_per_s": 10.0,
             "ttft_p50_s": 1.0, "ttft_p99_s": 2.0, "inter_token_p99_s": 0.1,
             "repeated_tools_ttft_p50_s": 0.3}
    lines = goals({"toolspec": {1: level, 8: {**level, "completion_tokens_per_s": 40.0}},
                   "plain": {8: {**level, "completion_tokens_per_s": 20.0}}})
    text = "\n".join(lines)
    assert "50.0% of forward rows" in text and "at 8 / at 1: 4.00x" in text
    assert "toolspec / plain throughput at 8: 2.00x" in text


def test_the_autoscaling_summary_times_each_step_of_the_load() -> None:
    timeline = [{"t": t, "clients": 0, "replicas": {"RUNNING": running}}
                for t, running in ((0, 1), (50, 1), (70, 1), (95, 2), (200, 2), (310, 2),
                                   (390, 1), (470, 1))]
    summary = summarize_autoscale(timeline, [], [(1, 60.0), (16, 240.0), (1, 180.0)])
    assert summary["replicas_at_start"] == 1 and summary["replicas_peak"] == 2
    assert summary["all_peak_replicas_running_after_step_up_s"] == 35
    assert summary["back_to_start_after_step_down_s"] == 90
    assert summary["failed"] == 0


def test_guidellm_gets_our_requests_and_its_report_reads_as_our_table(tmp_path: Path) -> None:
    import guidellm_bench

    data = tmp_path / "requests.jsonl"
    count = guidellm_bench.write(data, apibank_file("apibank:level-2"), ["simple_python:2"], 60)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == count > 2
    assert all(row["tool_choice"] == "auto" and row["tools"] and row["messages"] for row in rows)

    def metric(mean: float, p50: float, p99: float) -> dict[str, Any]:
        return {"successful": {"mean": mean, "percentiles": {"p50": p50, "p99": p99}}}

    report = {"benchmarks": [{
        "config": {"strategy": {"streams": 4}},
        "scheduler_metrics": {"requests_made": {"successful": 9, "errored": 1}},
        "metrics": {"output_tokens_per_second": metric(21.5, 20, 30),
                    "requests_per_second": metric(0.5, 0.5, 0.5),
                    "time_to_first_token_ms": metric(900, 800, 2500),
                    "inter_token_latency_ms": metric(40, 35, 120)}}]}
    [row] = guidellm_bench.summarize(report)
    assert row == {"streams": 4, "output_tokens_per_s": 21.5, "requests_per_s": 0.5,
                   "ttft_p50_ms": 800, "ttft_p99_ms": 2500, "itl_p50_ms": 35,
                   "itl_p99_ms": 120, "requests": 9, "errors": 1}
    assert "| 4 | 21.5 | 0.50 | 800 / 2500 | 35 / 120 | 9 | 1 |" in guidellm_bench.markdown([row])


def test_the_peer_benchmark_compares_answers_and_reads_its_goals() -> None:
    """``load_tests/peer_bench.py``'s reading of a run: one answer per request (calls parsed
    from vLLM's text or as this deployment streamed them), the share equal to vLLM plain's,
    the best SuffixDecoding K per level, and the issue's goals."""
    import peer_bench

    call = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
    from_text = RequestRecord("vllm", 1, 0.0, 0.1, 1.0, 20, 1.0, 200, key="s#0", output=call)
    streamed = RequestRecord("toolspec", 1, 0.0, 0.1, 1.0, 20, 3.0, 200, key="s#0",
                             calls=(("get_weather", {"city": "Oslo"}),))
    prose = RequestRecord("vllm", 1, 0.0, 0.1, 1.0, 20, 1.0, 200, key="s#1",
                          output=" It is sunny. ")
    assert peer_bench.answer(from_text) == peer_bench.answer(streamed)
    assert peer_bench.answer(prose) == "It is sunny."
    # A call cut off at max_tokens: this deployment streams it with its arguments so far;
    # vLLM's text holds the same characters, after prose; a bare object is a call too.
    cut = 'Sure:\n```json\n{"name": "get_weather", "arguments": {"city": "Os'
    streamed_cut = RequestRecord("toolspec", 1, 0.0, 0.1, 1.0, 20, 3.0, 200, key="s#2",
                                 calls=(("get_weather", '{"city": "Os'),))
    assert peer_bench.answer(streamed_cut) == peer_bench.comparable(cut)
    bare = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert peer_bench.comparable(bare) == peer_bench.answer(streamed)
    assert peer_bench.comparable(peer_bench.answer(streamed)) == peer_bench.answer(streamed)

    def level(tokens: float, ttft: float, answers: dict[str, str]) -> dict:
        return {"completion_tokens_per_s": tokens, "ttft_p50_s": ttft, "ttft_p99_s": 2 * ttft,
                "inter_token_p50_s": 0.05, "inter_token_p99_s": 0.1, "mat": 2.0,
                "answers": answers}

    results = {
        "vllm": {1: level(10, 0.5, {"a": "x", "b": "y"}), 8: level(40, 1.0, {"a": "x"})},
        "vllm-b32": {1: level(9, 0.4, {}), 8: level(30, 0.9, {})},
        "vllm-suffix-k8": {1: level(20, 0.5, {"a": "x"}), 8: level(45, 1.0, {})},
        "vllm-suffix-k16": {1: level(25, 0.5, {}), 8: level(42, 1.0, {})},
        "toolspec-vllm-k16": {1: level(40, 0.5, {"a": "x", "b": "z"}),
                              8: level(60, 1.1, {"a": "x"})},
    }
    identity = peer_bench.compare(results)
    assert identity["toolspec-vllm-k16"]["identical"] == 2
    assert identity["toolspec-vllm-k16"]["compared"] == 3
    assert identity["toolspec-vllm-k16"]["different"][0]["request"] == "b"
    assert peer_bench.best_of(results, "vllm-suffix", 1) == "vllm-suffix-k16"
    assert peer_bench.best_of(results, "vllm-suffix", 8) == "vllm-suffix-k8"
    text = "\n".join(peer_bench.goals(results, "toolspec-vllm-k16"))
    assert "1 session(s): toolspec-vllm-k16 1.60x vllm-suffix-k16" in text
    assert "8 session(s): toolspec-vllm-k16 1.50x vllm (goal" in text  # plain at its best
    assert "TTFT p99 at 8: 1.10x vllm's" in text
    assert "| toolspec-vllm-k16 | 8 | 60.0 |" in peer_bench.table(results, identity, [1, 8])


def test_the_peer_benchmark_splits_its_path_overhead_by_answer_kind() -> None:
    """``path_overhead``: request by request, this deployment's time to first token over vLLM
    plain's (at its best block), apart for call answers and text answers."""
    import peer_bench

    call = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
    streamed = json.dumps([["get_weather", {"city": "Oslo"}]])
    server = {"completion_tokens_per_s": 10, "answers": {"a": call, "b": "Hi", "c": "Yo"},
              "ttft_by_request": {"a": 0.25, "b": 0.25, "c": 0.30}}
    ours = {"completion_tokens_per_s": 9, "answers": {"a": streamed, "b": "Hi", "c": "Yo"},
            "ttft_by_request": {"a": 0.75, "b": 0.30, "c": 0.34}}
    lines = peer_bench.path_overhead({"vllm-b32": {1: server},
                                      "deployment-vllm-plain": {1: ours}})
    assert lines == [
        "1 session(s), text answers: TTFT deployment-vllm-plain - vllm-b32 median +0.050 s "
        "over 2 requests",
        "1 session(s), tool-call answers: TTFT deployment-vllm-plain - vllm-b32 median "
        "+0.500 s over 1 requests"]
    assert peer_bench.path_overhead({"vllm-b32": {1: server}}) == []


def test_the_peer_benchmark_names_each_engine_it_can_run() -> None:
    """``--step-caps`` adds the deployment with other per-step draft caps (to tune the
    shipped one); every engine's name is unique."""
    import peer_bench

    specs = {spec.name: spec for spec in peer_bench.engines([8], [16], 5, [16, 64])}
    assert specs["toolspec-vllm-k16-cap16"].model == {
        "engine": "vllm", "speculative_method": "toolspec", "speculative_tokens": 16,
        "step_draft_tokens": 16}
    assert specs["toolspec-vllm-k16-uncapped"].model["step_draft_tokens"] is None
    assert "step_draft_tokens" not in specs["toolspec-vllm-k16"].model  # serve_config.yaml's
    assert len(specs) == len(peer_bench.engines([8], [16], 5, [16, 64]))
