"""The offline simulator's account of where verification steps ended (toy vocabulary)."""

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import ScriptedDrafter, ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.sim import SimTarget, simulate, step_end_counts, write_step_ends
from toolspec.core.budget import FixedBudget
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.drafter import DraftRequest

OUTPUT = (10, 11, 12, 13, 14, 15, 16, 17)


class TwoBranchDrafter:
    """Proposes a likely wrong token and, less likely, the true next two; knows nothing about
    the tokens at ``unknown`` positions."""

    name = "two-branch"

    def __init__(self, unknown: frozenset[int]) -> None:
        self.unknown = unknown
        self.position = 0

    def start(self, request: DraftRequest) -> None:
        self.position = 0

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if self.position in self.unknown:
            return DraftTree((99,), (ROOT,), ("guess",), (0.9,))
        truth = OUTPUT[self.position: self.position + 2]
        return DraftTree((99, *truth), (ROOT, ROOT, 1)[: len(truth) + 1],
                         ("guess", "truth", "truth")[: len(truth) + 1],
                         (0.9, 0.1, 1.0)[: len(truth) + 1])

    def observe(self, accepted: Sequence[int]) -> None:
        self.position += len(accepted)

    def stop(self) -> None:
        pass


def target() -> SimTarget:
    return SimTarget("item", (1, 2, 3), OUTPUT, DraftRequest((1, 2, 3)))


def test_steps_end_where_the_budget_cut_the_right_branch_or_none_was_proposed() -> None:
    # Budget 1 keeps only the likely wrong guess: every step ends with the truth proposed
    # but cut, except at position 3 where the drafter knew nothing.
    report = simulate(TwoBranchDrafter(frozenset({3})), [target()], FixedBudget(1),
                      ToyTokenizer())
    ends = report.step_ends
    assert [end.position for end in ends] == list(range(len(OUTPUT) - 1))
    assert all(end.accepted == 0 and end.nodes == 1 for end in ends)
    assert [end.proposed for end in ends] == [2, 2, 2, 0, 2, 2, 2]
    # At position 3 the drafter guessed another token.
    assert [end.cause for end in ends] == ["cut"] * 3 + ["other"] + ["cut"] * 3
    assert step_end_counts(ends) == {"text": {"steps": 7, "cut": 6, "other": 1, "ran_out": 0}}


def test_a_tree_that_reaches_the_output_end_records_no_step_end(tmp_path: Path) -> None:
    report = simulate(TwoBranchDrafter(frozenset({3})), [target()], FixedBudget(8),
                      ToyTokenizer())
    # With room for both branches the truth is accepted two tokens a step (plus the bonus):
    # steps end at 2 (bonus 2), then the unknown position 3 costs a step of its own.
    assert [(end.position, end.accepted, end.proposed) for end in report.step_ends] == [
        (2, 2, 2), (3, 0, 0), (6, 2, 2)]
    # After two true tokens the drafter had proposed nothing further: it ran out.
    assert [end.cause for end in report.step_ends] == ["ran_out", "other", "ran_out"]
    path = tmp_path / "ends.jsonl"
    write_step_ends(path, report.step_ends, [target()], ToyTokenizer())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[1]["text"] == "<13>" and rows[1]["before"] == "<10><11><12>"


def test_sim_estimates_a_fixed_budget_on_a_cost_curve(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--budget` with `--cost-curve` replays the fixed cap and prices it on the curve (how the
    served default was compared with a fixed 7); the curve alone sizes the trees itself."""
    from toolspec.bench.datasets import sample_path
    from toolspec.bench.main import main

    curve = tmp_path / "cost_curve.json"
    curve.write_text(json.dumps({"seconds": {"1": 0.1, "8": 0.15, "64": 0.5}}))
    common = ["sim", "--drafter", "pld", "--data", str(sample_path()), "--limit", "2",
              "--cost-curve", str(curve)]
    assert main([*common, "--budget", "3"]) == 0
    fixed = capsys.readouterr().out
    assert "budget 3\n" in fixed and "estimated decode speed-up" in fixed
    assert main(common) == 0
    assert "cost-aware budget" in capsys.readouterr().out
    # A drafter named with its own cap (the schema alias included) replays that cap.
    assert main(["sim", "--drafter", "schema@4", *common[3:]]) == 0
    assert "budget 4\n" in capsys.readouterr().out


def test_the_replay_runs_the_engines_loop_step_for_step() -> None:
    """A replay of what the model wrote, with the same drafter and budget, takes exactly the
    verification steps and accepts exactly the drafts the real decoding did: the simulator
    drives the engine's own loop (``DecodeJob``, ``Engine.step``), not a copy of it."""
    vocab = 96
    model, prompt = TargetModel(tiny_model("qwen2", vocab)), [5, 9, 2, 7, 7, 1]
    params = GenerationParams(max_new_tokens=24)
    output = Engine(model, ToyTokenizer(), budget=0).generate(prompt, None, params).tokens
    real = Engine(model, ToyTokenizer(), budget=FixedBudget(6)).generate(
        prompt, ScriptedDrafter(output, vocab, seed=3), params)
    assert real.tokens == output  # lossless in fp32
    replay = simulate(ScriptedDrafter(output, vocab, seed=3),
                      [SimTarget("item", tuple(prompt), output, DraftRequest(tuple(prompt)))],
                      FixedBudget(6), ToyTokenizer(), max_new_tokens=24)
    assert replay.steps == len(real.verifications)
    assert replay.emitted == len(output)
    assert replay.accepted_by_source == real.accepted_by_source()
