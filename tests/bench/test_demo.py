"""``toolspec demo``, the first thing a newcomer runs: it cannot crash on a valid run, it shows
end-to-end figures, and its outputs are plain decoding's where the arithmetic is exact."""

from __future__ import annotations

import pytest

from toolspec.bench.datasets import load_apibank, sample_path
from toolspec.bench.demo import format_item, verdict
from toolspec.bench.main import main
from toolspec.bench.run import ItemResult


def _result(method: str, steps: int, decode_s: float, identical: bool = True,
            margin: float | None = None) -> ItemResult:
    return ItemResult(item="level-1-1", method=method, tokens=[1, 2], text=" call ",
                      new_tokens=2, decode_tokens=1, steps=steps, prefill_s=0.5,
                      decode_s=decode_s, accepted_by_source={}, identical_to_ar=identical,
                      first_difference=None if identical else 7, ar_margin=margin)


def test_an_answer_that_arrives_in_the_prompts_forward_is_shown_not_divided_by_zero() -> None:
    item = load_apibank(sample_path(), limit=1)[0]
    text = format_item(item, {"ar": _result("ar", 2, 0.4),
                              "toolspec": _result("toolspec", 0, 0.0)}, exact=True)
    assert "toolspec      : 2 tokens in 1 forwards, 0.50 s, 1.80x end to end" in text
    assert "identical to plain decoding" in text


def test_a_bf16_difference_is_named_a_near_tie_with_its_margin() -> None:
    different = _result("pld", 1, 0.2, identical=False, margin=0.0625)
    assert "near-tie" in verdict(different, exact=False)
    assert "0.062 apart" in verdict(different, exact=False)
    assert "should not happen" in verdict(different, exact=True)


@pytest.mark.real_model
def test_the_demo_runs_two_items_end_to_end_with_identical_outputs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--model", "smollm2-135m", "--dtype", "fp32", "--items", "2",
                 "--max-new-tokens", "48"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "x end to end; " in line]
    assert [line.split()[0] for line in lines] == ["pld", "toolspec"] * 2, out
    assert all(line.endswith("identical to plain decoding") for line in lines), out
    assert "e2e x" in out  # the summary table leads with the end-to-end speed-up
