"""The one batch driver: jobs stepped together, delivered in turn, rotated past a full batch."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from toolspec.core.batch import BatchDriver
from toolspec.core.generation import Generation, StepEvent, StepOutcome, StepResult


def _event(done: bool) -> StepEvent:
    generation = Generation(1, (), "", "stop", 0.0, 0.0, ()) if done else None
    return StepEvent((1,), "x", None, generation)


class Counter:
    """A step function: each job (a name) takes ``steps[name]`` steps; records each batch."""

    def __init__(self, steps: dict[str, int]) -> None:
        self.left = dict(steps)
        self.batches: list[list[str]] = []

    def __call__(self, jobs: Sequence[str]) -> StepResult:
        self.batches.append(list(jobs))
        outcomes = []
        for job in jobs:
            self.left[job] -= 1
            outcomes.append(StepOutcome(_event(self.left[job] == 0)))
        return StepResult(outcomes)


def _until_over(seen: list[str], name: str):
    def deliver(outcome: StepOutcome) -> bool:
        seen.append(name)
        return outcome.event.generation is not None
    return deliver


def test_every_active_job_runs_in_each_turn_until_it_is_over() -> None:
    step, seen = Counter({"a": 1, "b": 3}), []
    driver: BatchDriver[str] = BatchDriver(step)
    driver.add("a", _until_over(seen, "a"))
    driver.add("b", _until_over(seen, "b"))
    while driver:
        driver.turn()
    assert step.batches == [["a", "b"], ["b"], ["b"]]
    assert seen == ["a", "b", "b", "b"]


def test_a_full_batch_rotates_so_every_job_is_served() -> None:
    step = Counter({name: 2 for name in "abc"})
    driver: BatchDriver[str] = BatchDriver(step, max_batch=2)
    for name in "abc":
        driver.add(name, _until_over([], name))
    while driver:
        driver.turn()
    assert step.batches == [["a", "b"], ["c", "a"], ["c", "b"]]


def test_a_step_that_raises_fails_every_job_in_it_and_only_those() -> None:
    def broken(jobs: Sequence[str]) -> StepResult:
        raise RuntimeError("the forward broke")

    errors: list[Exception] = []

    def deliver(outcome: StepOutcome) -> bool:
        errors.append(outcome.error)
        return True

    driver: BatchDriver[str] = BatchDriver(broken, max_batch=1)
    driver.add("a", deliver)
    driver.add("b", deliver)
    driver.turn()
    assert [str(error) for error in errors] == ["the forward broke"] and driver.jobs == ["b"]


def test_a_job_sitting_a_step_out_is_not_told_and_a_dropped_one_is_gone() -> None:
    told: list[str] = []
    driver: BatchDriver[str] = BatchDriver(lambda jobs: StepResult([None] * len(jobs)))
    driver.add("a", lambda outcome: told.append("a") or False)
    driver.add("b", lambda outcome: told.append("b") or False)
    driver.turn()
    driver.drop("a")
    assert told == [] and driver.jobs == ["b"]
    with pytest.raises(ValueError, match="active already"):
        driver.add("b", lambda outcome: True)
