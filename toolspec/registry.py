"""The only place a method name becomes drafters and a draft budget: used by the benchmark and
by serving, so that what is measured is what is served.

A ``DrafterFactory`` builds one method's drafter for each request. What drafters learn across
requests lives in the factory, per tenant — the suffix trie over earlier outputs and the model's
writing habits (``StyleMemory``) — plus one tokenization cache for all; a request's drafter is
built on its tenant's memory, so concurrent requests of a tenant share what the tenant's earlier
requests taught, and one tenant's outputs never shape another's drafts. A benchmark run is one
tenant whose requests come one after another; a replica serves many tenants at once; both get
their drafters here.

``build_engine`` gives the engine a budget: the cost-aware budget sized to this machine's cost
curve (measured once, cached), or a fixed node cap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.core.budget import CostAwareBudget, CostModel, DraftBudget, FixedBudget, rows_per_step
from toolspec.core.drafter import Drafter, NoDrafter
from toolspec.core.engine import Engine
from toolspec.core.prefix_cache import PrefixCache
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.retrieval import RetrievalDrafter, ToolSpecDrafter
from toolspec.drafting.schema import SchemaDrafter
from toolspec.drafting.style import StyleMemory
from toolspec.drafting.suffix_decoding import SuffixDecodingDrafter, SuffixOutputCache
from toolspec.drafting.token_continuation import TokenContinuer
from toolspec.library import CallLibrary
from toolspec.model.loading import LoadedModel
from toolspec.model.target_model import TargetModel

PLAIN = "ar"
# SuffixDecoding's papers draft at most one node per matched token (max_spec_factor 1, a GPU
# default). Sized by this machine's cost-aware budget, longer proposals pay: swept on the dev
# parts (API-Bank L1's first 100, BFCL simple_python's first 50, recorded outputs, bf16 curve of
# a 2-core AMX Xeon), `suffix` alone went 3.13x → 4.04x (factor 8; 16 no better) and `toolspec`
# over it 6.00x → 6.42x estimated decode (docs/baselines.md, "Tuned for this machine").
SUFFIX_SPEC_FACTOR = 8.0
# Methods that draft from the call library (they need one).
LIBRARY_METHODS = frozenset({"toolspec-retrieval", "toolspec", "toolspec-pld"})


class UnknownMethodError(ValueError):
    """A method name that no drafter is registered for."""


class MissingLibraryError(ValueError):
    """A retrieval method was asked for without a call library."""


@dataclass
class TenantMemory:
    """What one tenant's requests teach the drafters, kept across requests. Mutates: at each
    request's end (its drafter's ``stop``)."""

    suffix: SuffixOutputCache = field(default_factory=SuffixOutputCache)
    style: StyleMemory = field(default_factory=StyleMemory)


@dataclass(frozen=True)
class _Parts:
    """What a method's drafter is built from for one request."""

    tokenizer: PreTrainedTokenizerBase
    memory: TenantMemory
    continuer: TokenContinuer | None
    library: CallLibrary | None

    def suffix(self) -> SuffixDecodingDrafter:
        return SuffixDecodingDrafter(cache=self.memory.suffix,
                                     max_spec_factor=SUFFIX_SPEC_FACTOR)

    def needs_library(self, method: str) -> CallLibrary:
        if self.library is None:
            raise MissingLibraryError(f"method {method!r} drafts from a call library: give one")
        return self.library


def _suffix(parts: _Parts) -> Drafter:
    return parts.suffix()


def _prompt_lookup(parts: _Parts) -> Drafter:
    return PromptLookupDrafter()


def _tool_drafter(kind: type, fallback: Callable[[_Parts], Drafter], method: str
                  ) -> Callable[[_Parts], Drafter]:
    def build(parts: _Parts) -> Drafter:
        shared = {"memory": parts.memory.style, "continuer": parts.continuer}
        if kind is SchemaDrafter:
            return SchemaDrafter(parts.tokenizer, fallback(parts), **shared)
        return kind(parts.tokenizer, parts.needs_library(method), fallback(parts), **shared)
    return build


Builder = Callable[[_Parts], Drafter]
# Per method: its drafter for requests with tools, and its drafter for requests without
# (a tool-call method drafts free text with its fallback alone).
_METHODS: dict[str, tuple[Builder, Builder]] = {
    PLAIN: (lambda parts: NoDrafter(), lambda parts: NoDrafter()),
    "suffix": (_suffix, _suffix),
    # Values and free text are drafted by `suffix`, the best model-free baseline.
    "toolspec-schema": (_tool_drafter(SchemaDrafter, _suffix, "toolspec-schema"), _suffix),
    "toolspec-retrieval": (_tool_drafter(RetrievalDrafter, _suffix, "toolspec-retrieval"),
                           _suffix),
    "toolspec": (_tool_drafter(ToolSpecDrafter, _suffix, "toolspec"), _suffix),
    # Ablation: the full method over the paper's prompt-lookup fallback.
    "toolspec-pld": (_tool_drafter(ToolSpecDrafter, _prompt_lookup, "toolspec-pld"),
                     _prompt_lookup),
}
METHODS = tuple(_METHODS)
_TOOL_METHODS = frozenset({"toolspec-schema", "toolspec-retrieval", "toolspec", "toolspec-pld"})


class DrafterFactory:
    """Drafters of ``method`` per request, over per-tenant memory (the ``max_tenants`` most
    recently used tenants kept). ``library``: the call library retrieval methods draft from
    (a request may bring its own view; drafters read it, ``CallLibrary.remember`` fills it).
    Mutates: its tenants' memories."""

    def __init__(self, method: str, tokenizer: PreTrainedTokenizerBase,
                 library: CallLibrary | None = None, max_tenants: int = 256) -> None:
        if method not in _METHODS:
            raise UnknownMethodError(f"unknown method {method!r}; available: "
                                     f"{', '.join(_METHODS)}")
        self.method = method
        self.tokenizer = tokenizer
        self.library = library
        self.max_tenants = max_tenants
        self._continuer: TokenContinuer | None = None
        self._tenants: OrderedDict[str, TenantMemory] = OrderedDict()

    @property
    def continuer(self) -> TokenContinuer:
        """The tokenization cache of every drafter built here (made on first use: only
        tool-call methods need one, and it needs a fast tokenizer)."""
        if self._continuer is None:
            self._continuer = TokenContinuer(self.tokenizer)
        return self._continuer

    def sibling(self, method: str) -> DrafterFactory:
        """A factory of ``method`` over the same tenant memories and tokenization cache (a
        replica without a call library drafts ``toolspec-schema`` into the memory its
        ``toolspec`` requests would use)."""
        other = DrafterFactory(method, self.tokenizer, self.library, self.max_tenants)
        other._tenants = self._tenants
        if self.method in _TOOL_METHODS or method in _TOOL_METHODS:
            other._continuer = self.continuer
        return other

    def memory(self, tenant: str) -> TenantMemory:
        """``tenant``'s memory (created on first use; the least recently used beyond
        ``max_tenants`` forgotten)."""
        memory = self._tenants.pop(tenant, None) or TenantMemory()
        self._tenants[tenant] = memory
        while len(self._tenants) > self.max_tenants:
            self._tenants.popitem(last=False)
        return memory

    def for_request(self, tenant: str = "default", tools_offered: bool = True,
                    library: CallLibrary | None = None) -> Drafter:
        """A drafter for one request of ``tenant``. Without tools to call, a tool-call method
        drafts as its fallback (the tenant's suffix trie) alone."""
        tool_call = tools_offered and self.method in _TOOL_METHODS
        parts = _Parts(self.tokenizer, self.memory(tenant),
                       self.continuer if tool_call else None, library or self.library)
        with_tools, without_tools = _METHODS[self.method]
        return (with_tools if tools_offered else without_tools)(parts)


def budget_for(cost: CostModel | None, fixed_nodes: int | None) -> DraftBudget:
    """The one way a draft budget is built (engines here, the simulator): a fixed cap of
    ``fixed_nodes`` nodes (0, or neither given: plain decoding), else the cost-aware budget on
    ``cost``."""
    if fixed_nodes is not None or cost is None:
        return FixedBudget(fixed_nodes or 0)
    return CostAwareBudget(cost)


def build_engine(loaded: LoadedModel, fixed_nodes: int | None = None,
                 cost: CostModel | None = None, draft_at_prefill: bool = True,
                 step_rows: int | Literal["auto"] = 0, prefix_cache: PrefixCache | None = None,
                 target: TargetModel | None = None) -> Engine:
    """An engine whose trees follow ``cost`` (default: this machine's cached cost curve for
    ``loaded``), or capped at ``fixed_nodes`` nodes (0: plain decoding). ``step_rows``: rows
    per forward at most (0: no limit; ``auto``: from the cost curve, ``rows_per_step``).
    ``prefix_cache``: prompt blocks kept across requests, on ``target`` (``PrefixCache(target,
    budget_bytes, target.block_tokens)``; None: none). ``target``: how the model runs (default:
    ``TargetModel(loaded.model)``; a split model's ``ShardedTarget``)."""
    from toolspec.model.cost_curve import cached_cost_model

    target = target or TargetModel(loaded.model)
    if cost is None and (fixed_nodes is None or step_rows == "auto"):
        cost = cached_cost_model(loaded, target=target)
    rows = rows_per_step(cost, target.block_tokens) if step_rows == "auto" else step_rows
    return Engine(target, loaded.tokenizer, budget_for(cost, fixed_nodes),
                  draft_at_prefill=draft_at_prefill, step_rows=rows, prefix_cache=prefix_cache)
