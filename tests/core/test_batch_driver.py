"""The one batch driver: jobs stepped together, delivered in turn, rotated past a full batch,
oldest first (prompts that arrive while others decode start in arrival order)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from helpers import ToyTokenizer, tiny_model

from toolspec.core.batch import BatchDriver
from toolspec.core.engine import Engine
from toolspec.core.generation import (
    Generation,
    GenerationParams,
    StepEvent,
    StepOutcome,
    StepResult,
)
from toolspec.core.job import DecodeJob
from toolspec.model.target_model import TargetModel


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
    assert step.batches == [["a", "b"], ["a", "c"], ["b", "c"]]  # each step oldest first


def test_prompts_start_oldest_first_while_others_decode() -> None:
    """Two requests decode; two prompts arrive, then a third: past ``max_batch`` the turns
    rotate, yet each prompt is computed only once every older one has its first token (the
    old rotation sent the later arrival's prompt ahead of the older ones'), and a decoding
    request advances every turn beside them."""
    block = 8
    model = TargetModel(tiny_model("qwen2", 96), block_tokens=block)
    # No drafts (a decoding job is one row), and one prompt block a step beside them.
    engine = Engine(model, ToyTokenizer(), budget=0, stop_token_ids=[], step_rows=block + 1)
    driver: BatchDriver[DecodeJob] = BatchDriver(engine.step, max_batch=4)

    def start(length: int, new_tokens: int) -> DecodeJob:
        job = engine.start([4 + i % 90 for i in range(length)],
                           params=GenerationParams(max_new_tokens=new_tokens))
        driver.add(job, lambda outcome: outcome.error is not None
                   or outcome.event.generation is not None)
        return job

    decoding = [start(5, 200), start(6, 200)]
    while any(job.prefilling for job in decoding):
        driver.turn()
    prompts = [start(4 * block + 3, 2), start(3 * block + 1, 2)]
    driver.turn()
    prompts.append(start(2 * block + 5, 2))  # a later arrival, while the others wait
    while any(job.prefilling for job in prompts):
        before = sum(len(job.generated) for job in decoding)
        driver.turn()
        assert sum(len(job.generated) for job in decoding) > before
        for older, later in zip(prompts, prompts[1:]):
            if older.prefilling:  # no first token yet: nothing of the later one computed
                assert later.prompt_position == 0 and later.cached_tokens == 0


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
