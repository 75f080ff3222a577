"""The ToolSpec proposer's drafting as vLLM drives it, without vLLM: request ids, token lists,
one chain per step; what a request carries in ``extra_args``; failures kept to their request;
tenants kept apart."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from helpers import REPO

from toolspec.bench.chains import drafting_request, replay_chains, replay_one
from toolspec.bench.datasets import load_dataset
from toolspec.bench.sim import SimTarget, recorded_targets
from toolspec.calls.formats import ToolCall
from toolspec.core.draft_tree import DraftTree
from toolspec.library import CallLibrary
from toolspec.model.packages import load_tokenizer
from toolspec.vllm.request import (
    EXTRA_ARGS_KEY,
    DraftingRequest,
    DraftingRequestError,
)
from toolspec.vllm.sessions import DraftSessions, SessionSettings, best_chain

RECORDED = REPO / "docs" / "recorded" / "apibank-l1-first100.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("qwen2.5-coder-0.5b")


@pytest.fixture(scope="module")
def targets(tokenizer) -> list[SimTarget]:
    items = load_dataset("apibank:level-1", limit=40)
    return recorded_targets(tokenizer, items, RECORDED)


def _serve(tokenizer, targets: list[SimTarget], method: str, max_tokens: int = 16
           ) -> tuple[float, int]:
    """Every target one after another for one tenant, each request carrying the calls the
    earlier ones made (as the replica's library view holds them). Returns tokens per step
    and the longest chain."""
    with tempfile.TemporaryDirectory() as home, CallLibrary(home) as library:
        report = replay_chains(tokenizer, targets, SessionSettings(max_tokens=max_tokens,
                                                                   method=method),
                               library, "acme")
    return report.tokens_per_step, report.longest_chain


def test_extra_args_carry_a_request_and_reject_a_malformed_one() -> None:
    request = DraftingRequest(tenant="acme", method="toolspec", call_format="json",
                              tools=({"type": "function", "function": {"name": "f"}},),
                              conversation="hi", past_calls=({"name": "f", "arguments": {}},))
    assert DraftingRequest.from_extra_args(request.to_extra_args()) == request
    assert DraftingRequest.from_extra_args(None) is None
    assert DraftingRequest.from_extra_args({"other": 1}) is None
    for bad in ({"call_format": "yaml"}, {"tenant": 3}, {"tools": "f"}, {"past_calls": [1]}):
        with pytest.raises(DraftingRequestError):
            DraftingRequest.from_extra_args({EXTRA_ARGS_KEY: bad})


def test_best_chain_is_the_path_with_most_expected_tokens() -> None:
    #      0 (a) - 1 (b) - 2 (c)        reach .9 .5 .05
    #      3 (d) - 4 (e)                reach .8 .8
    tree = DraftTree((1, 2, 3, 4, 5), (-1, 0, 1, -1, 3), ("s",) * 5)
    reach = [0.9, 0.5, 0.05, 0.8, 0.8]
    assert best_chain(tree, reach, max_tokens=8, min_reach=0.0) == [3, 4]  # 1.6 > 1.45
    assert best_chain(tree, reach, max_tokens=1, min_reach=0.0) == [0]
    assert best_chain(tree, [0.9, 0.9, 0.9, 0.1, 0.1], 8, min_reach=0.5) == [0, 1, 2]
    assert best_chain(tree, [0.9, 0.9, 0.05, 0.1, 0.1], 8, min_reach=0.1) == [0, 1]
    assert best_chain(tree, [0.01] * 5, 8, min_reach=0.1) == []
    assert best_chain(DraftTree(), [], 8, 0.1) == []


def test_replayed_outputs_are_drafted_as_chains_that_beat_the_fallback(tokenizer,
                                                                       targets) -> None:
    """The model's own API-Bank outputs (recorded plain decoding), one request after another:
    ToolSpec's chains (call grammar + the calls earlier requests made + suffix fallback) take
    more tokens per step than its fallback alone, and no chain is longer than K."""
    toolspec, longest = _serve(tokenizer, targets, "toolspec")
    suffix, _ = _serve(tokenizer, targets, "suffix")
    assert longest <= 16
    assert toolspec >= 3.0, toolspec
    assert toolspec > 1.2 * suffix, (toolspec, suffix)


def test_a_request_that_cannot_be_drafted_for_fails_alone(tokenizer, targets) -> None:
    sessions = DraftSessions(tokenizer, SessionSettings(max_tokens=8))
    good, bad = targets[0], targets[1]
    sessions.start("good", good.prompt_ids, drafting_request(good, "acme", None))
    broken = DraftingRequest(tenant="acme", method="no-such-method")
    sessions.start("bad", bad.prompt_ids, broken)
    assert "bad" in sessions and sessions.stats.failed_requests == 1
    assert sessions.propose("bad", [*bad.prompt_ids, *bad.output_ids[:3]], 8) == []
    steps, _ = replay_one(sessions, "good", good.prompt_ids, good.output_ids, 8)
    assert steps < len(good.output_ids) - 1  # it still drafts, and some drafts were taken
    sessions.retire(["good"])
    assert "bad" not in sessions and "good" in sessions
    sessions.retire(())
    assert len(sessions) == 0
    sessions.close()


def test_one_tenants_past_calls_are_never_drafted_for_another(tokenizer, targets) -> None:
    """Tenant A made a call with a value nobody else wrote; the model now writes that call again
    for A and for B (same prompt). A's drafts bring the value before the model has written it;
    B's never do."""
    target = next(t for t in targets if t.request.tools.names)
    tool = target.request.tools.tools[0]
    secret = "Zanzibar-7731"
    call = ToolCall(tool.name, {name: secret for name in tool.parameter_order()} or {"q": secret})
    call_format = target.request.call_format
    output = tokenizer.encode(call_format.render([call]), add_special_tokens=False) \
        + [tokenizer.eos_token_id]
    sessions = DraftSessions(tokenizer, SessionSettings(max_tokens=16))
    early = {}
    with tempfile.TemporaryDirectory() as home, CallLibrary(home) as library:
        for _ in range(3):
            library.add(call, tenant="a")
        for tenant in ("b", "a"):
            sessions.start(tenant, target.prompt_ids, drafting_request(target, tenant, library))
            context, emitted, drafted = [*target.prompt_ids, output[0]], 1, ""
            while emitted < len(output):
                chain = sessions.propose(tenant, context, 16)
                if secret[:4] not in tokenizer.decode(output[:emitted]):
                    drafted += tokenizer.decode(chain)  # drafted before the model wrote it
                accepted = 0
                while accepted < len(chain) and emitted + accepted < len(output) \
                        and chain[accepted] == output[emitted + accepted]:
                    accepted += 1
                context.extend(output[emitted:emitted + accepted + 1])
                emitted += accepted + 1
            early[tenant] = drafted
            sessions.retire(())
    sessions.close()
    assert secret not in early["b"] and "Zanz" not in early["b"]
    assert secret in early["a"]


def test_a_steps_token_budget_keeps_the_likeliest_tokens_of_all_chains() -> None:
    from toolspec.vllm.sessions import _likeliest

    a = DraftTree((1, 2, 3), (-1, 0, 1), ("s",) * 3)
    b = DraftTree((4, 5), (-1, 0), ("s",) * 2)
    chains = [(a, [0.9, 0.5, 0.2]), (b, [0.8, 0.6]), (DraftTree(), [])]
    assert _likeliest(chains, None) == [3, 2, 0]
    assert _likeliest(chains, 10) == [3, 2, 0]
    assert _likeliest(chains, 3) == [1, 2, 0]  # .9, .8, .6
    assert _likeliest(chains, 4) == [2, 2, 0]
    assert _likeliest(chains, 0) == [0, 0, 0]


def test_a_batch_under_a_step_budget_verifies_at_most_that_many_tokens(tokenizer,
                                                                          targets) -> None:
    sessions = DraftSessions(tokenizer, SessionSettings(max_tokens=16, step_tokens=12))
    rows = []
    for index, target in enumerate(targets[:4]):
        sessions.start(str(index), target.prompt_ids, drafting_request(target, "acme", None))
        rows.append((str(index), [*target.prompt_ids, *target.output_ids[:2]], 16))
    drafts = sessions.propose_batch(rows)
    assert 0 < sum(map(len, drafts)) <= 12
    assert sessions.stats.drafted == sum(map(len, drafts))
    sessions.close()


def test_the_simulator_replays_recorded_outputs_as_chains(tmp_path: Path, capsys) -> None:
    """``toolspec sim --chains K``: the same recorded items as the tree replay, through the
    proposer's sessions, one chain of at most K tokens per step."""
    from toolspec.bench.main import main

    out = tmp_path / "chains.json"
    assert main(["sim", "--data", "apibank:level-1", "--limit", "10", "--recorded",
                 str(RECORDED), "--drafter", "toolspec", "--chains", "8", "--json",
                 str(out)]) == 0
    assert "chains of at most 8 tokens" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["items"] == 10 and report["chains"] == 8
    assert report["longest_chain"] <= 8 and report["tokens_per_step"] > 2.0
