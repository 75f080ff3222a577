"""The load scripts' arithmetic (no server): what ``load_tests/concurrency.py`` and
``load_tests/autoscale.py`` report from the requests and the replica timeline they recorded."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "load_tests"))

from autoscale import summarize as summarize_autoscale  # noqa: E402
from concurrency import RequestRecord, goals, summarize  # noqa: E402


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
