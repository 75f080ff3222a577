"""``Engine.stream``: the step events add up to exactly what ``generate`` returns."""

import random

from helpers import ToyTokenizer, tiny_model
from toolspec import Engine, GenerationParams, TargetModel
from toolspec.drafters import OracleDrafter

VOCAB = 96


def _engine() -> Engine:
    return Engine(TargetModel(tiny_model("qwen2", VOCAB)), ToyTokenizer(), budget=12,
                  stop_token_ids=[])


def test_events_add_up_to_the_generation_with_many_tokens_per_step() -> None:
    engine = _engine()
    prompt = [random.Random(7).randrange(VOCAB) for _ in range(20)]
    params = GenerationParams(max_new_tokens=40)
    plain = engine.generate(prompt, None, params)
    events = list(engine.stream(prompt, OracleDrafter(plain.tokens), params))
    final = events[-1].generation
    assert final is not None and all(e.generation is None for e in events[:-1])
    assert final.tokens == plain.tokens
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
