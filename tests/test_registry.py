"""One registry of drafters for the benchmark and for serving: per-tenant memory that lasts
across requests, and the same trees whether a request is served or benchmarked."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from deployments.messages import ChatRequest
from deployments.replica.toolspec_engine import ServedDrafters
from toolspec.bench.datasets import load_apibank, sample_path
from toolspec.bench.methods import METHODS, MethodSetup
from toolspec.bench.sim import reference_targets, simulate
from toolspec.core.budget import FixedBudget
from toolspec.core.draft_tree import DraftTree
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.drafting.retrieval import ToolSpecDrafter
from toolspec.drafting.suffix_decoding import SuffixDecodingDrafter
from toolspec.library import CallLibrary
from toolspec.model.packages import load_tokenizer
from toolspec.registry import SUFFIX_SPEC_FACTOR, DrafterFactory, UnknownMethodError


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("qwen2.5-coder-0.5b")


def test_each_tenant_has_its_own_memory_and_the_least_recent_goes(tokenizer) -> None:
    factory = DrafterFactory("toolspec-schema", tokenizer, max_tenants=2)
    acme = factory.memory("acme")
    acme.suffix.add([1, 2, 3])
    assert factory.memory("acme") is acme
    assert (1, 2) not in factory.memory("globex").suffix.trie.counts()
    factory.memory("acme")
    factory.memory("initech")  # globex goes
    assert factory.memory("acme") is acme
    sibling = factory.sibling("suffix")
    assert sibling.memory("acme") is acme and sibling.continuer is factory.continuer
    with pytest.raises(UnknownMethodError):
        DrafterFactory("nope", tokenizer)


class Recording:
    """A drafter per request from ``make``, recording every proposed tree."""

    name = "recording"

    def __init__(self, make: Callable[[DraftRequest], Drafter]) -> None:
        self.make = make
        self.trees: list[DraftTree] = []
        self._drafter: Drafter | None = None

    def start(self, request: DraftRequest) -> None:
        self._drafter = self.make(request)
        self._drafter.start(request)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        tree = self._drafter.propose(context, budget)
        self.trees.append(tree)
        return tree

    def observe(self, emitted: Sequence[int]) -> None:
        self._drafter.observe(emitted)

    def stop(self) -> None:
        self._drafter.stop()


def test_the_served_drafter_and_the_benchmarked_one_draft_the_same_trees(tokenizer,
                                                                         tmp_path) -> None:
    """Five API-Bank requests of one tenant, one after another: the replica's drafters (one per
    request, over the tenant's memory), the benchmark's method, and one drafter kept for the
    whole run propose the same trees at every step — and the memory made a difference."""
    items = load_apibank(sample_path())
    targets = reference_targets(tokenizer, items) * 2  # the second round drafts from memory
    # A fixed clock: stored calls rank by use and recency, which would differ run to run.
    libraries = [CallLibrary(tmp_path / f"library-{n}", clock=lambda: 1.8e9) for n in range(4)]
    served = ServedDrafters(tokenizer)
    bench = METHODS["toolspec"](MethodSetup(tokenizer, libraries[1]))
    persistent = ToolSpecDrafter(tokenizer, libraries[2],
                                 SuffixDecodingDrafter(max_spec_factor=SUFFIX_SPEC_FACTOR))
    forgetful = DrafterFactory("toolspec", tokenizer)

    def chat(request: DraftRequest) -> ChatRequest:
        return ChatRequest("r", "m", (), tools=request.tools, tenant=request.tenant)

    runs = [
        Recording(lambda request: served.for_request(chat(request), libraries[0])),
        Recording(lambda request: bench(())),
        Recording(lambda request: persistent),
        # A new factory per request: nothing learned across requests.
        Recording(lambda request: DrafterFactory("toolspec", tokenizer)
                  .for_request(request.tenant, True, libraries[3])),
    ]
    for run, library in zip(runs, libraries):
        simulate(run, targets, FixedBudget(16), tokenizer, library=library)
    assert runs[0].trees == runs[1].trees == runs[2].trees
    assert runs[3].trees != runs[0].trees
    assert forgetful.memory("default").style.styles == {}
    for library in libraries:
        library.close()
