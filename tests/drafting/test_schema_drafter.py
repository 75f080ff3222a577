"""Schema-aware drafting: token-exact drafts, legal names only, lossless end to end."""

import random

import pytest
import torch
from helpers import TEST_DATA, tiny_model

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.bench.datasets import load_apibank, load_bfcl
from toolspec.bench.sim import reference_targets, simulate
from toolspec.calls.formats import CallState, ToolCall, get_format
from toolspec.calls.tools import ToolSet
from toolspec.core.budget import FixedBudget
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.schema import SchemaDrafter
from toolspec.drafting.text_drafts import NAME
from toolspec.drafting.token_continuation import TokenContinuer
from toolspec.model.packages import load_tokenizer


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return load_tokenizer("qwen2.5-coder-0.5b")


@pytest.fixture(scope="module")
def targets(qwen_tokenizer):
    items = (load_apibank(TEST_DATA / "apibank-100.json") + load_bfcl("simple_python", 40)
             + load_bfcl("multiple", 20) + load_bfcl("parallel", 25)
             + load_bfcl("parallel_multiple", 15))
    return reference_targets(qwen_tokenizer, items)


def test_forced_spans_are_tokenized_like_the_whole_text(qwen_tokenizer, targets) -> None:
    """Teacher-forced along each ground-truth output: every schema draft whose text is right
    must carry the token ids the tokenizer gives the whole output text."""
    tokenizer = qwen_tokenizer
    calls = sum(len(t.request.call_format.parse(tokenizer.decode(t.output_ids))) for t in targets)
    assert calls >= 200
    forced = matched = 0
    for target in targets:
        output = list(target.output_ids[:-1])  # without end-of-sequence
        text = tokenizer.decode(output)
        ends = [end for _, end in tokenizer(text, return_offsets_mapping=True,
                                            add_special_tokens=False)["offset_mapping"]]
        drafter = SchemaDrafter(tokenizer)
        drafter.start(target.request)
        drafter.observe(output[:1])
        for position in range(1, len(output)):
            committed = [*target.prompt_ids, *output[:position]]
            start = ends[position - 1]
            for draft in drafter.text_drafts():
                if not draft.text or not text.startswith(draft.text, start):
                    continue
                ids = drafter.continuer.continue_many(committed, [draft.text])[0].ids
                span_end = start + len(draft.text)
                for offset, want in enumerate(output[position:]):
                    if ends[position + offset] > span_end:
                        break  # this token reaches past the forced span
                    forced += 1
                    matched += offset < len(ids) and ids[offset] == want
            drafter.observe(output[position: position + 1])
        drafter.stop()
    assert forced > 3000
    assert matched / forced >= 0.98, f"{matched}/{forced} forced positions match"


def test_drafts_never_name_a_tool_outside_the_set(qwen_tokenizer, targets) -> None:
    for target in targets[:40]:
        allowed = set(target.request.tools.names)
        drafter = SchemaDrafter(qwen_tokenizer)
        drafter.start(target.request)
        output = target.output_ids
        drafter.observe(output[:1])
        for position in range(1, len(output)):
            scanner = drafter.scanner
            for draft in drafter.text_drafts():
                names = [s.text for s in draft.segments if s.source == NAME]
                if names and draft.segments[0].source == NAME and \
                        scanner.state is CallState.TOOL_NAME:
                    names[0] = scanner.partial + names[0]  # the name being typed
                assert set(names) <= allowed, names
            drafter.observe(output[position: position + 1])


def test_simulated_mat_on_ground_truth_calls(qwen_tokenizer, targets) -> None:
    drafter = SchemaDrafter(qwen_tokenizer, fallback=PromptLookupDrafter())
    report = simulate(drafter, targets, FixedBudget(16), qwen_tokenizer)
    summary = report.as_dict()
    assert report.mat > 3.5
    by_state = summary["acceptance_by_state"]
    # Structure is drafted almost entirely; names and parameter names are schema choices.
    assert by_state["call_key"]["fraction"] > 0.95
    assert by_state["param_name"]["fraction"] > 0.85
    assert by_state["tool_name"]["fraction"] > 0.85


def test_style_is_learned_from_the_models_own_output(qwen_tokenizer) -> None:
    tools = ToolSet.from_functions([{"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}])
    fmt = get_format("json")
    from toolspec.core.drafter import DraftRequest
    drafter = SchemaDrafter(qwen_tokenizer)
    compact = '{"name":"f","arguments":{"a":"x"}}'
    drafter.start(DraftRequest((1, 2), tools, fmt))
    drafter.observe(qwen_tokenizer.encode(compact))
    drafter.stop()
    drafter.start(DraftRequest((1, 2), tools, fmt))
    drafter.observe(qwen_tokenizer.encode('{"name":'))
    texts = [d.text for d in drafter.text_drafts()]
    assert texts and all(t.startswith('"f","arguments":{"a":"') for t in texts)


def test_schema_drafting_is_lossless_on_a_tiny_model(qwen_tokenizer) -> None:
    """A random model with the real vocabulary, prompted with a tool call to continue: every
    output must equal plain decoding, token for token."""
    model = TargetModel(tiny_model("qwen2", vocab_size=len(qwen_tokenizer)))
    tools = ToolSet.from_functions([
        {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}},
        {"name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"type": "string"}}}},
    ])
    fmt = get_format("hermes")
    engine = Engine(model, qwen_tokenizer, budget=24, stop_token_ids=[qwen_tokenizer.eos_token_id])
    drafter = SchemaDrafter(qwen_tokenizer, fallback=PromptLookupDrafter())
    rng = random.Random(0)
    example = fmt.render([ToolCall("get_weather", {"city": "Paris", "unit": "c"})])
    accepted = 0
    for _ in range(4):
        noise = [rng.randrange(len(qwen_tokenizer)) for _ in range(rng.randint(0, 6))]
        prompt = qwen_tokenizer.encode(example) + noise + qwen_tokenizer.encode(example)
        params = GenerationParams(max_new_tokens=40)
        plain = engine.generate(prompt, None, params)
        drafted = engine.generate(prompt, drafter, params, tools=tools, call_format=fmt)
        assert drafted.tokens == plain.tokens
        accepted += sum(step.accepted for step in drafted.steps)
    assert torch.is_tensor(torch.tensor(accepted))


def test_sources_cannot_crowd_the_fallback_out(qwen_tokenizer) -> None:
    """Inside a string value the schema offers every way to end it, enough to fill any budget;
    the fallback's continuation of the value must still be offered, for the draft budget to
    weigh against them, and no path may grow deeper than the budget."""
    from collections.abc import Sequence

    from toolspec.core.draft_tree import DraftTree
    from toolspec.core.drafter import DraftRequest

    class Chain:
        name = "chain"

        def start(self, request: DraftRequest) -> None: ...
        def observe(self, emitted: Sequence[int]) -> None: ...
        def stop(self) -> None: ...

        def propose(self, context: Sequence[int], budget: int) -> DraftTree:
            return DraftTree.from_sequences([([11, 12, 13, 14, 15, 16][:budget], self.name)])

    properties = {f"p{i}": {"type": "string"} for i in range(12)}
    tools = ToolSet.from_functions([{"name": "f", "parameters": {
        "type": "object", "properties": properties}}])
    drafter = SchemaDrafter(qwen_tokenizer, fallback=Chain())
    prefix = qwen_tokenizer.encode('{"name": "f", "arguments": {"p0": "Par')
    drafter.start(DraftRequest((1, 2), tools, get_format("json")))
    drafter.observe(prefix)
    tree = drafter.propose([1, 2, *prefix], 4)
    from_chain = [token for token, source in zip(tree.tokens, tree.sources) if source == "chain"]
    assert from_chain == [11, 12, 13, 14]
    assert sum(source != "chain" for source in tree.sources) == 4  # the schema's full share
    assert tree.max_depth() <= 4


def test_a_lone_date_keeps_its_share_after_the_opening_quote(qwen_tokenizer) -> None:
    """After ``"time": "`` the conversation's one date is the value with the grammar's date
    share: the bare opening and the other values' branches share that quote with it and must
    not dilute it (each counts once in the quote's mass)."""
    from toolspec.core.drafter import DraftRequest
    from toolspec.drafting.call_grammar import GrammarPriors
    from toolspec.drafting.text_drafts import DATE

    tools = ToolSet.from_functions([{"name": "AddAlarm", "parameters": {
        "type": "object", "required": ["time"], "properties": {
            "time": {"type": "string", "description": "Format: %Y-%m-%d %H:%M:%S"},
            "note": {"type": "string"}}}}])
    conversation = 'Wake me on March 20th, 2023 at 6:30AM. Call it "Gym" or "Run" or "Swim".'
    drafter = SchemaDrafter(qwen_tokenizer, fallback=None)
    prefix = qwen_tokenizer.encode('{"name": "AddAlarm", "arguments": {"time": "')
    drafter.start(DraftRequest((1, 2), tools, get_format("json"), conversation))
    drafter.observe(prefix)
    tree = drafter.propose([1, 2, *prefix], 64)
    (first_date_node,) = [node for node in range(len(tree)) if tree.sources[node] == DATE
                          and tree.parents[node] == -1]
    assert tree.priors[first_date_node] == pytest.approx(GrammarPriors().date_share, rel=0.05)
    assert qwen_tokenizer.decode(_path_to_leaf(tree, first_date_node)).startswith(
        "2023-03-20 06:30:00")


def _path_to_leaf(tree, node: int) -> list[int]:
    """Tokens from ``node`` down its likeliest children to a leaf."""
    tokens = [tree.tokens[node]]
    while children := [c for c in range(len(tree)) if tree.parents[c] == node]:
        node = max(children, key=lambda c: tree.priors[c])
        tokens.append(tree.tokens[node])
    return tokens


def test_texts_tokenized_together_equal_each_tokenized_alone(qwen_tokenizer) -> None:
    """``continue_many`` of many texts is ``continue_many`` of each alone: the boundary merges
    (``"`` + ``name`` → ``{"``), shrunken windows and the cache give every text the ids of
    the whole string."""
    tokenizer = qwen_tokenizer
    committed = tokenizer.encode('<tool_call>\n{"name": "Query', add_special_tokens=False)
    texts = ['Stock", "parameters": {"', 'Balance"}', "Stock", "", " x<|im_end|>", "Stock"]
    together = TokenContinuer(tokenizer).continue_many(committed, texts)
    alone = [TokenContinuer(tokenizer).continue_many(committed, [text])[0] for text in texts]
    assert together == alone
    for text, continuation in zip(texts, together):
        whole = tokenizer.encode(tokenizer.decode(committed) + text, add_special_tokens=False)
        assert list(continuation.ids) == whole[len(committed):]
        assert (continuation.ends[-1] if continuation.ends else 0) == len(text)
    cached = TokenContinuer(tokenizer)
    cached.continue_many(committed, texts[:2])
    assert cached.continue_many(committed, texts) == together


def test_the_fallback_goes_on_below_the_likeliest_leaves(qwen_tokenizer) -> None:
    """Where the sources' drafts stop, a fallback that drafts after any context
    (``ContextDrafter``) continues the likeliest leaves as if their paths had been emitted, no
    deeper than the budget; a fallback that cannot is asked about the step's context only."""
    from collections.abc import Sequence

    from toolspec.core.draft_tree import ROOT, DraftTree
    from toolspec.core.drafter import ContextDrafter, DraftRequest

    class Echo:
        name = "echo"

        def __init__(self) -> None:
            self.asked: list[tuple[int, ...]] = []

        def start(self, request: DraftRequest) -> None: ...
        def observe(self, emitted: Sequence[int]) -> None: ...
        def stop(self) -> None: ...

        def propose(self, context: Sequence[int], budget: int) -> DraftTree:
            return self.propose_after(context, budget)

        def propose_after(self, context: Sequence[int], budget: int) -> DraftTree:
            self.asked.append(tuple(context))
            return DraftTree.from_sequences([([98, 99][:budget], self.name)])

    tools = ToolSet.from_functions([{"name": "f", "parameters": {
        "type": "object", "required": ["unit"], "properties": {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "city": {"type": "string"}}}}])
    prefix = qwen_tokenizer.encode('{"name": "f", "arguments": {"unit": "')
    context = [1, 2, *prefix]
    request = DraftRequest((1, 2), tools, get_format("json"), "Weather in Paris, in celsius")

    def proposed(fallback, budget: int = 12, extended_leaves: int = 2) -> DraftTree:
        drafter = SchemaDrafter(qwen_tokenizer, fallback=fallback)
        drafter.extended_leaves = extended_leaves
        drafter.start(request)
        drafter.observe(prefix)
        return drafter.propose(context, budget)

    sources_only = proposed(None)
    leaves = [leaf for leaf in sources_only.leaves()
              if sources_only.tokens[leaf] != qwen_tokenizer.eos_token_id]
    likeliest = sorted(leaves, key=lambda leaf: -sources_only.reaches[leaf])[:2]
    echo = Echo()
    assert isinstance(echo, ContextDrafter)
    tree = proposed(echo)
    assert tree.tokens[: len(sources_only)] == sources_only.tokens
    grafted = {tree.parents[node] for node in range(len(tree))
               if tree.tokens[node] == 98 and tree.parents[node] != ROOT}
    assert grafted == set(likeliest)
    paths = {tuple(tree.tokens[n] for n in sources_only.path_to(leaf)) for leaf in likeliest}
    assert {asked[len(context):] for asked in echo.asked[:-1]} == paths
    assert echo.asked[-1] == tuple(context)  # the root's draft comes last, as before
    assert tree.max_depth() <= 12
    assert len(proposed(Echo(), extended_leaves=0)) == len(sources_only) + 2
