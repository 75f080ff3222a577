"""Retrieval-augmented drafting over a real call library (LMDB files in tmp_path)."""

import random
from pathlib import Path

import pytest
from helpers import TEST_DATA, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.datasets import load_apibank
from toolspec.bench.sim import SimReport, reference_targets, simulate
from toolspec.calls.formats import ToolCall, get_format
from toolspec.calls.tools import ToolSet
from toolspec.core.budget import FixedBudget
from toolspec.core.drafter import DraftRequest
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.retrieval import RETRIEVAL, RetrievalDrafter, ToolSpecDrafter
from toolspec.drafting.schema import SchemaDrafter
from toolspec.library import CallLibrary
from toolspec.model.packages import load_tokenizer

TOOLS = ToolSet.from_functions([
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}},
    {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}, "required": ["zone"]}},
])
HERMES = get_format("hermes")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("qwen2.5-coder-0.5b")


@pytest.fixture
def library(tmp_path: Path):
    with CallLibrary(tmp_path / "library", sync=False) as opened:
        yield opened


def request(tokenizer, tenant: str = "acme", conversation: str = "") -> DraftRequest:
    return DraftRequest(tuple(tokenizer.encode("hi")), TOOLS, HERMES, conversation, tenant)


def test_stored_values_are_drafted_once_the_tool_is_known(tokenizer, library) -> None:
    library.add(ToolCall("get_weather", {"city": "Reykjavik", "unit": "celsius"}), "acme")
    drafter = RetrievalDrafter(tokenizer, library)
    drafter.start(request(tokenizer))
    drafter.observe(tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'))
    texts = [d.text for d in drafter.text_drafts()]
    assert any(t.startswith('Reykjavik", "unit": "celsius"}}') for t in texts)
    assert all(s.source in (RETRIEVAL, "schema/close") for d in drafter.text_drafts()
               for s in d.segments)


def test_whole_calls_are_offered_before_the_call_starts(tokenizer, library) -> None:
    library.add(ToolCall("get_time", {"zone": "UTC"}), "acme")
    drafter = ToolSpecDrafter(tokenizer, library)
    drafter.start(request(tokenizer))
    drafter.observe(tokenizer.encode("<tool_call>\n"))
    texts = [d.text for d in drafter.text_drafts()]
    assert '{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>' in texts


def test_other_tools_calls_do_not_crowd_out_the_offered_tools(tokenizer, library) -> None:
    for n in range(40):  # a seeded library: many frequent calls of tools this request lacks
        for _ in range(3):
            library.add(ToolCall(f"other_tool_{n}", {"q": n}), "acme")
    library.add(ToolCall("get_time", {"zone": "UTC"}), "acme")
    drafter = ToolSpecDrafter(tokenizer, library)
    drafter.start(request(tokenizer))
    drafter.observe(tokenizer.encode("<tool_call>\n"))
    assert '{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>' in \
        [d.text for d in drafter.text_drafts()]


def test_tenants_never_see_each_others_calls(tokenizer, library) -> None:
    library.add(ToolCall("get_weather", {"city": "Secretville"}), "other-tenant")
    drafter = RetrievalDrafter(tokenizer, library)
    drafter.start(request(tokenizer, tenant="acme"))
    drafter.observe(tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": {"'))
    assert not any("Secretville" in d.text for d in drafter.text_drafts())


def test_finished_calls_reach_the_library_by_one_path_and_only_for_offered_tools(
        tokenizer, library) -> None:
    drafter = ToolSpecDrafter(tokenizer, library)
    drafter.start(request(tokenizer, tenant="acme"))
    output = [ToolCall("get_time", {"zone": "CET"}), ToolCall("unknown_tool", {})]
    drafter.observe(tokenizer.encode(HERMES.render(output)))
    drafter.stop()
    assert list(library.records("acme")) == []  # drafters read the library, never write it
    stored = library.remember(output, TOOLS.names, "acme")
    assert [r.call for r in stored] == [ToolCall("get_time", {"zone": "CET"})]
    assert [r.call for r in library.records("acme")] == [ToolCall("get_time", {"zone": "CET"})]
    refused = []
    not_json = ToolCall("get_time", {"zone": float("nan")})
    library.remember([not_json], TOOLS.names, "acme",
                     on_invalid=lambda call, error: refused.append(call))
    assert refused == [not_json]


def test_retrieval_is_lossless_on_a_tiny_model(tokenizer, library) -> None:
    model = TargetModel(tiny_model("qwen2", vocab_size=len(tokenizer)))
    engine = Engine(model, tokenizer, budget=24, stop_token_ids=[tokenizer.eos_token_id])
    drafter = ToolSpecDrafter(tokenizer, library, PromptLookupDrafter())
    rng = random.Random(1)
    for round_ in range(3):
        library.add(ToolCall("get_weather", {"city": f"City{round_}"}), "acme")
        prompt = tokenizer.encode(HERMES.render([ToolCall("get_weather", {"city": "X"})]))
        prompt += [rng.randrange(len(tokenizer)) for _ in range(4)]
        params = GenerationParams(max_new_tokens=32)
        plain = engine.generate(prompt, None, params)
        drafted = engine.generate(prompt, drafter, params, tools=TOOLS, call_format=HERMES,
                                  tenant="acme")
        assert drafted.tokens == plain.tokens


def test_a_growing_library_raises_mat_over_the_schema_alone(tokenizer, tmp_path) -> None:
    """Cold start on API-Bank ground truth: the library fills item by item, and once it holds
    the calls of the first 75 items the next 25 take fewer steps than with the schema alone
    (over the first items a library of a few calls proposes the wrong ones about as often as
    the schema's own choice of tool is wrong)."""
    targets = reference_targets(tokenizer, load_apibank(TEST_DATA / "apibank-100.json"))
    schema = simulate(SchemaDrafter(tokenizer, PromptLookupDrafter()), targets, FixedBudget(16),
                      tokenizer)
    with CallLibrary(tmp_path / "cold", sync=False) as library:
        full = simulate(ToolSpecDrafter(tokenizer, library, PromptLookupDrafter()),
                        targets, FixedBudget(16), tokenizer, library=library)
        assert library.stats().calls > 50
    def warm_mat(report: SimReport) -> float:
        warm = report.per_item[75:]
        return sum(item.emitted for item in warm) / sum(item.steps for item in warm)

    assert warm_mat(full) > warm_mat(schema)
    assert full.accepted_by_source[RETRIEVAL] > 0
