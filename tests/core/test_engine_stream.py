"""``Engine.stream``: the step events add up to exactly what ``generate`` returns."""

import random

from helpers import ToyTokenizer, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.baselines.oracle import OracleDrafter
from toolspec.core.engine import Generation, StepEvent

VOCAB = 96


def _engine() -> Engine:
    return Engine(TargetModel(tiny_model("qwen2", VOCAB)), ToyTokenizer(), budget=12,
                  stop_token_ids=[])


def _plain_and_oracle_events(engine: Engine, seed: int, prompt_length: int, max_new_tokens: int
                             ) -> tuple[Generation, list[StepEvent], Generation]:
    """Plain decoding's output, and the events and generation of an oracle-drafted stream."""
    prompt = [random.Random(seed).randrange(VOCAB) for _ in range(prompt_length)]
    params = GenerationParams(max_new_tokens=max_new_tokens)
    plain = engine.generate(prompt, None, params)
    events = list(engine.stream(prompt, OracleDrafter(plain.tokens), params))
    final = events[-1].generation
    assert final is not None and final.tokens == plain.tokens
    return plain, events, final


def test_events_add_up_to_the_generation_with_many_tokens_per_step() -> None:
    plain, events, final = _plain_and_oracle_events(_engine(), 7, 20, 40)
    assert all(e.generation is None for e in events[:-1])
    assert tuple(t for e in events for t in e.tokens) == plain.tokens
    assert "".join(e.text for e in events) == plain.text
    assert events[0].stats is None and max(len(e.tokens) for e in events) > 1
    assert [e.stats for e in events[1:]] == list(final.steps)


def test_text_deltas_never_show_a_stop_string() -> None:
    engine = _engine()
    prompt = [3, 1, 4, 1, 5]
    free = engine.generate(prompt, None, GenerationParams(max_new_tokens=30))
    stop = f"<{free.tokens[10]}><{free.tokens[11]}>"
    params = GenerationParams(max_new_tokens=30, stop=(stop,))
    for drafter in (None, OracleDrafter(free.tokens)):
        shown = ""
        for event in engine.stream(prompt, drafter, params):
            shown += event.text
            assert stop not in shown
        assert shown == event.generation.text


def test_closing_the_stream_early_stops_the_drafter() -> None:
    class Recording(OracleDrafter):
        stopped = False

        def stop(self) -> None:
            Recording.stopped = True

    engine = _engine()
    stream = engine.stream([1, 2, 3], Recording((5,) * 30), GenerationParams(max_new_tokens=30))
    next(stream)
    next(stream)
    stream.close()
    assert Recording.stopped


def test_the_first_tree_rides_on_the_prefill_forward() -> None:
    engine = _engine()
    plain, events, final = _plain_and_oracle_events(engine, 8, 15, 30)
    # first token + a full tree's tokens, before any decode step
    assert len(events[0].tokens) == engine.budget.max_nodes + 1
    assert final.prefill_step is not None and final.prefill_step.accepted == engine.budget.max_nodes
    assert final.verifications == (final.prefill_step, *final.steps)
    assert final.decode_tokens == len(plain.tokens) - 1


def test_without_prefill_drafting_the_prefill_chooses_one_token() -> None:
    engine = _engine()
    engine.draft_at_prefill = False
    plain, events, final = _plain_and_oracle_events(engine, 9, 15, 30)
    assert len(events[0].tokens) == 1 and final.prefill_step is None
    assert final.verifications == final.steps and final.decode_tokens == len(plain.tokens) - 1


def test_a_long_prompt_is_prefilled_in_chunks_beside_decoding_with_an_empty_event_after_each(
        ) -> None:
    engine = _engine()
    prompt = [random.Random(5).randrange(VOCAB) for _ in range(23)]
    params = GenerationParams(max_new_tokens=20)
    whole = engine.generate(prompt, None, params)
    engine.model.block_tokens = engine.block_tokens = 5
    engine.step_rows = 6  # a decoding request's row, then one block of the prompt per step
    for drafter in (None, OracleDrafter(whole.tokens)):
        other = engine.start([1, 2, 3], None, GenerationParams(max_new_tokens=40))
        engine.step([other])  # decoding from now on
        job = engine.start(prompt, drafter, params)
        events = []
        while not job.done:
            outcome = engine.step([other, job]).outcomes[1]
            events.append(outcome.event)
        chunks = [e for e in events if not e.tokens and e.generation is None]
        assert len(chunks) == 4 and events[:4] == chunks  # 5+5+5+5 tokens, then 3 with the tree
        assert events[-1].generation.tokens == whole.tokens
        other.close()


def test_with_nobody_decoding_the_first_prompt_runs_whole_and_the_others_wait() -> None:
    engine = _engine()
    engine.model.block_tokens = engine.block_tokens = 4
    engine.step_rows = 4
    events = list(engine.stream(list(range(1, 41)), None, GenerationParams(max_new_tokens=3)))
    assert events[0].tokens
    assert len(events) == 3  # the prefill's token, then two steps: no empty chunk events
    params = GenerationParams(max_new_tokens=3)
    first, second = (engine.start(list(range(n, n + 40)), None, params) for n in (1, 50))
    result = engine.step([first, second])
    outcomes = result.outcomes
    assert outcomes[0].event.tokens and outcomes[1] is None  # one prompt's forward, not two
    assert result.report is not None and result.report.jobs == 1
    assert result.report.jobs_sitting_out == 1
