import json
from dataclasses import dataclass

import pytest

from toolspec.core.budget import (
    AcceptanceCalibration,
    CostAwareBudget,
    CostCurveFileError,
    CostModel,
    FixedBudget,
)
from toolspec.core.draft_tree import ROOT, DraftTree, WeightedDraft


@dataclass(frozen=True)
class Acceptance:
    """What the model accepted of a verified tree, as the engine tells its budget
    (``VerifiedTree``; the engine's is ``toolspec.core.job.TreeAcceptance``)."""

    tree: DraftTree
    accepted: tuple[int, ...]
    rides_on_prefill: bool = False


def test_cost_curves_load_from_curve_files_and_bench_results(tmp_path) -> None:
    (tmp_path / "cost_curve.json").write_text(json.dumps({"seconds": {"1": 0.1, "4": 0.2}}))
    (tmp_path / "results.json").write_text(json.dumps({"cost_curve": {"1": 1.0, "4": 2.0}}))
    (tmp_path / "fixed.json").write_text(json.dumps({"cost_curve": None, "methods": {}}))
    for name in ("cost_curve.json", "results.json"):
        assert CostModel.load(tmp_path / name).cost(4) == pytest.approx(2.0)
    with pytest.raises(CostCurveFileError, match="fixed.json: holds no cost curve"):
        CostModel.load(tmp_path / "fixed.json")


def test_cost_model_interpolates_and_extrapolates() -> None:
    model = CostModel.from_timings({1: 0.1, 2: 0.11, 4: 0.2, 8: 0.24})
    assert model.cost(1) == 1.0
    assert model.cost(3) == pytest.approx(1.55)
    assert model.cost(8) == pytest.approx(2.4)
    assert model.cost(16) == pytest.approx(2.4 + 8 * 0.1)
    with pytest.raises(ValueError):
        CostModel((2, 4), (1.0, 2.0))


def test_fixed_budget_keeps_the_likeliest_nodes() -> None:
    likely = WeightedDraft((1, 2, 3), ("a",) * 3, (0.9, 0.8, 0.7))
    unlikely = WeightedDraft((4, 5), ("b",) * 2, (0.1, 0.05))
    tree = DraftTree.from_weighted([unlikely, likely])
    assert FixedBudget(2).select_batch([tree])[0].tokens == (1, 2)
    assert FixedBudget(4).select_batch([tree])[0].tokens == (4, 1, 2, 3)  # tree order kept
    assert FixedBudget(9).select_batch([tree])[0] is tree


def test_fixed_budget_follows_the_calibration() -> None:
    """A source the model keeps rejecting loses its place to one it accepts."""
    tree = DraftTree.from_sequences([([1, 2], "rejected"), ([3, 4], "accepted")])
    budget = FixedBudget(2, AcceptanceCalibration(smoothing=1.0))
    for _ in range(5):
        budget.observe_batch([Acceptance(tree, (2, 3))])
    assert budget.select_batch([tree])[0].tokens == (3, 4)


def chain(length: int, prior: float, source: str = "s") -> DraftTree:
    tokens = tuple(range(1, length + 1))
    reach = tuple(prior ** (i + 1) for i in range(length))
    return DraftTree.from_weighted([WeightedDraft(tokens, (source,) * length, reach)])


def test_cheap_verification_takes_long_likely_chains() -> None:
    budget = CostAwareBudget(CostModel.linear(0.01),
                             calibration=AcceptanceCalibration(smoothing=1e9))
    assert len(budget.select_batch([chain(40, 0.99)])[0]) == 40


def test_expensive_verification_takes_nothing_unlikely() -> None:
    steep = CostModel.from_timings({1: 1.0, 2: 1.05, 4: 2.0, 64: 3.0})
    budget = CostAwareBudget(steep, calibration=AcceptanceCalibration(smoothing=1e9))
    # k=2 is nearly free: one node pays
    assert len(budget.select_batch([chain(10, 0.3)])[0]) == 1
    assert len(budget.select_batch([chain(10, 0.02)])[0]) == 0
    # A certain chain pays for the jump in cost.
    assert len(budget.select_batch([chain(63, 0.995)])[0]) == 63


def certain(budget: CostAwareBudget) -> CostAwareBudget:
    """``budget`` with its calibration pinned to the drafters' priors."""
    budget.calibration = AcceptanceCalibration(smoothing=1e9)
    return budget


def test_a_node_is_kept_when_its_reach_beats_the_rate_times_its_cost() -> None:
    """At 0.1 of a step per node and a rate of 3 tokens per step, a node must be accepted
    with more than 0.3 probability, whatever else the tree holds: a good step keeps a 0.35
    node that would lower its own tokens-per-cost ratio, a poor step drops a 0.25 node that
    would raise its ratio."""
    budget = certain(CostAwareBudget(CostModel.linear(0.1), prior_rate=3.0))
    good = DraftTree.from_weighted([
        WeightedDraft((1, 2, 3, 4), ("s",) * 4, (0.99, 0.98, 0.97, 0.35))])
    # ratio at 3 nodes: 3.94 / 1.3 = 3.03 > 4.29 / 1.4
    assert len(budget.select_batch([good])[0]) == 4
    poor = DraftTree.from_weighted([WeightedDraft((1,), ("s",), (0.25,))])
    assert len(budget.select_batch([poor])[0]) == 0  # though 1.25 / 1.1 > 1 / 1


def test_the_rate_is_learned_from_decoding_steps_only() -> None:
    budget = certain(CostAwareBudget(CostModel.linear(0.1), prior_rate=2.0, prior_weight=1.0))
    tree = chain(8, 0.99)
    assert budget.rate == pytest.approx(2.0)
    budget.observe_batch([Acceptance(tree, tuple(range(8)), True)])  # the prompt's forward
    assert budget.rate == pytest.approx(2.0)
    for _ in range(200):  # steps that verify 9 tokens (cost 1.8) and emit 9
        budget.observe_batch([Acceptance(tree, tuple(range(8)))])
    assert budget.rate == pytest.approx(9 / 1.8, rel=0.01)
    # At 5 tokens per step, a node must be accepted with more than 0.5: the chain stops
    # where its reach (0.8 ** depth) falls below.
    assert len(budget.select_batch([chain(8, 0.8)])[0]) == 3
    for _ in range(2000):  # steps that verify 9 tokens and emit 1: the rate falls, trees grow
        budget.observe_batch([Acceptance(tree, ())])
    assert budget.rate == pytest.approx(1 / 1.8, rel=0.01)
    assert len(budget.select_batch([chain(8, 0.8)])[0]) == 8


def test_selection_is_always_a_connected_subtree() -> None:
    drafts = [
        WeightedDraft((1, 2, 3), ("s",) * 3, (0.6, 0.6, 0.6)),
        WeightedDraft((1, 5), ("s", "s"), (0.6, 0.3)),
        WeightedDraft((7, 8), ("t", "t"), (0.4, 0.35)),
    ]
    tree = DraftTree.from_weighted(drafts)
    budget = CostAwareBudget(CostModel.linear(0.05),
                             calibration=AcceptanceCalibration(smoothing=1e9))
    selected = budget.select_batch([tree])[0]
    assert all(parent == ROOT or parent < index for index, parent in enumerate(selected.parents))
    assert len(selected) == len(tree)


def test_calibration_learns_each_kind_of_nodes_acceptance() -> None:
    calibration = AcceptanceCalibration(smoothing=1.0)
    # "good" chains are right; "bad" is always wrong; "mixed" is right after its first token.
    tree = DraftTree.from_sequences([([1, 2], "good"), ([3], "bad"), ([4, 5, 6], "mixed")])
    truth_good = [0, 1]
    for step in range(60):
        calibration.observe(tree, accepted=truth_good)
    mixed = DraftTree.from_sequences([([4, 5, 6], "mixed")])
    for step in range(60):
        calibration.observe(mixed, accepted=[0, 1, 2] if step % 4 == 0 else [])
    rates = calibration.rates()
    assert rates["good"] == pytest.approx(1.0) and rates["bad"] == 0.0
    p_good, _, p_bad, p_first, p_inner, _ = calibration.probabilities(tree)
    assert p_good == pytest.approx(0.995) and p_bad < 0.05
    assert p_first < 0.35 and p_inner == pytest.approx(0.995)
    fresh = DraftTree((7,), (ROOT,), ("unseen",), (0.8,))
    assert calibration.probabilities(fresh) == [pytest.approx(0.8)]


def test_calibration_tells_a_source_apart_by_what_it_follows() -> None:
    """A call's close after a value copied from the conversation is right; the same close
    after a fallback's guess is not: each is learned on its own."""
    calibration = AcceptanceCalibration(smoothing=1.0)
    after_value = DraftTree((1, 2), (ROOT, 0), ("value", "close"), (1.0, 0.3))
    after_guess = DraftTree((3, 4), (ROOT, 0), ("guess", "close"), (1.0, 0.3))
    for _ in range(40):
        calibration.observe(after_value, accepted=[0, 1])
        calibration.observe(after_guess, accepted=[0])
    assert calibration.probabilities(after_value)[1] > 0.9
    assert calibration.probabilities(after_guess)[1] < 0.05


def test_cost_curve_times_every_size_once_per_round() -> None:
    """Sizes are timed in interleaved rounds, so a burst of load from elsewhere on a shared
    machine falls on one sample of many sizes, not on every sample of one; the cache is left
    as the prefix after each forward."""
    from helpers import tiny_model

    from toolspec.model.cost_curve import measure_cost_curve
    from toolspec.model.target_model import TargetModel

    class RecordingModel(TargetModel):
        def __init__(self) -> None:
            super().__init__(tiny_model("qwen2", vocab_size=256))
            self.rows: list[int] = []
            self.cache_lengths: list[int] = []

        def forward_tree(self, cache, pending, tree):  # type: ignore[no-untyped-def]
            self.rows.append(len(tree) + 1)
            self.cache_lengths.append(cache.get_seq_length())
            return super().forward_tree(cache, pending, tree)

    model = RecordingModel()
    timings = measure_cost_curve(model, prefix_length=8, sizes=(1, 4, 2), repeats=2)
    assert model.rows == [1, 4, 2] * 3  # a warm-up round, then two timed ones
    assert set(model.cache_lengths) == {8}
    assert sorted(timings) == [1, 2, 4] and all(t > 0 for t in timings.values())


def test_processes_sharing_a_machine_measure_its_cost_curve_once(tmp_path, monkeypatch) -> None:
    """Replicas starting together take a lock: one measures (alone, so no replica times the
    others' load), the rest wait and read the file it replaced atomically."""
    import threading
    import time

    import torch
    from helpers import tiny_model

    from toolspec.model import cost_curve
    from toolspec.model.loading import LoadedModel

    monkeypatch.setenv("TOOLSPEC_HOME", str(tmp_path))
    measured: list[int] = []

    def slow_measurement(model, sizes, repeats):  # type: ignore[no-untyped-def]
        measured.append(len(sizes))
        time.sleep(0.3)  # long enough for the other callers to arrive while it measures
        return {k: 0.1 * (1 + 0.05 * (k - 1)) for k in sizes}

    monkeypatch.setattr(cost_curve, "measure_cost_curve", slow_measurement)
    loaded = LoadedModel("tiny", tiny_model("qwen2", vocab_size=64), None,  # type: ignore[arg-type]
                         torch.float32, torch.device("cpu"))
    curves = []
    threads = [threading.Thread(target=lambda: curves.append(cost_curve.cached_cost_model(loaded)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(measured) == 1 and len(curves) == 3
    assert [curve.cost(8) for curve in curves] == pytest.approx([1.35] * 3)
    written = list((tmp_path / "cost-curves").iterdir())
    assert [p.suffix for p in written if not p.name.startswith(".")] == [".json"]
    assert not [p for p in written if p.name.endswith(".partial")]
    cost_curve.cached_cost_model(loaded, refresh=True)  # refresh measures again, in place
    assert len(measured) == 2


def test_the_row_budget_is_where_a_rows_cost_stops_falling() -> None:
    from toolspec.core.budget import rows_per_step

    # A row costs 0.094, 0.078, 0.047, 0.044 of a one-row step at 32, 64, 128, 256 rows.
    curve = CostModel.from_timings({1: 1.0, 32: 3.0, 64: 5.0, 128: 6.0, 256: 11.2})
    assert rows_per_step(curve, 32) == 128
    assert rows_per_step(curve, 64) == 128  # whole blocks
    assert rows_per_step(CostModel.from_timings({1: 1.0, 2: 1.5}), 32) == 32  # at least one


def test_prompt_rows_in_the_same_forward_make_draft_rows_dearer() -> None:
    # Flat to 16 rows, then every row costs a tenth of a one-row step.
    curve = CostModel((1, 16, 512), (1.0, 1.2, 50.8))
    budget = CostAwareBudget(curve, calibration=AcceptanceCalibration(smoothing=1e9))
    tree = chain(12, 0.7)  # node k is reached with 0.7 ** k
    alone = budget.select_batch([tree])[0]
    beside_prompts = budget.select_batch([tree], other_rows=256)[0]
    assert (len(alone), len(beside_prompts)) == (10, 4)  # a node must beat 0.2 beside them
