"""The decoding methods a benchmark can compare, by name.

The served methods (``ar``, ``suffix``, ``toolspec``, its parts and ablations) come from the
one registry serving uses (``toolspec.registry``); the model-free baselines and the oracle are
measuring code and live here. A method is built once per run (so a drafter can learn across
items) and then asked for the drafter of each item, given plain decoding's output on that item
(the oracle drafts it, the others ignore it). Library-backed methods share the run's call
library, which the benchmark itself fills after each item (so no method ever sees the current
item's own call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.bench.baselines.oracle import OracleDrafter
from toolspec.bench.baselines.recycling import TokenRecyclingDrafter
from toolspec.bench.baselines.samd import SamDecodingDrafter
from toolspec.core.drafter import Drafter
from toolspec.drafting.prompt_lookup import PromptLookupDrafter
from toolspec.drafting.suffix_decoding import SuffixDecodingDrafter
from toolspec.library import CallLibrary
from toolspec.registry import (
    LIBRARY_METHODS,
    PLAIN,
    DrafterFactory,
    MissingLibraryError,
    UnknownMethodError,
)
from toolspec.registry import METHODS as REGISTERED

__all__ = ["BASELINE", "METHODS", "ORACLE", "RETRIEVAL_METHODS", "MethodSetup",
           "MissingLibraryError", "UnknownMethodError", "parse_methods", "split_budget"]


@dataclass(frozen=True)
class MethodSetup:
    tokenizer: PreTrainedTokenizerBase
    library: CallLibrary | None = None
    tenant: str = "default"


DrafterForItem = Callable[[Sequence[int]], Drafter]
MethodBuilder = Callable[[MethodSetup], DrafterForItem]

BASELINE = PLAIN
ORACLE = "oracle"  # drafts plain decoding's own output: the ceiling of any drafter


def _fresh(factory: Callable[[], Drafter]) -> MethodBuilder:
    return lambda setup: lambda ar_tokens: factory()


def _persistent(factory: Callable[[MethodSetup], Drafter]) -> MethodBuilder:
    def build(setup: MethodSetup) -> DrafterForItem:
        drafter = factory(setup)
        return lambda ar_tokens: drafter
    return build


def _served(method: str) -> MethodBuilder:
    """A method of the registry, drafted exactly as a replica drafts it: a drafter per item
    over the run's tenant memory. The benchmark fills the library itself (``learn`` off), after
    every method ran on an item."""
    def build(setup: MethodSetup) -> DrafterForItem:
        if method in LIBRARY_METHODS and setup.library is None:
            raise MissingLibraryError("retrieval methods need a call library (--library DIR)")
        factory = DrafterFactory(method, setup.tokenizer, setup.library)
        return lambda ar_tokens: factory.for_request(setup.tenant)
    return build


METHODS: dict[str, MethodBuilder] = {
    BASELINE: _served(BASELINE),
    # Model-free baselines (measuring code, not product): see docs/baselines.md.
    "pld": _fresh(PromptLookupDrafter),
    ORACLE: lambda setup: OracleDrafter,
    # Cross-request learners: one drafter per run; each learns an item's output at its stop().
    "samd": _persistent(lambda s: SamDecodingDrafter()),
    "recycling": _persistent(lambda s: TokenRecyclingDrafter()),
    # The served methods (suffix is also the best baseline, and ToolSpec's fallback).
    **{method: _served(method) for method in REGISTERED if method != BASELINE},
    # The sweep that tuned the baselines' proposal sizes for this machine (the budget keeps
    # what the cost curve pays for): `suffix` is factor 8, its papers' default 1 is `suffix-x1`;
    # prompt lookup gained nothing from longer continuations (docs/baselines.md, "Tuned").
    **{f"pld-{length}": _fresh(lambda length=length: PromptLookupDrafter(
        continuation_length=length)) for length in (20, 40)},
    **{f"suffix-x{factor:g}": _persistent(lambda s, factor=factor: SuffixDecodingDrafter(
        max_spec_factor=factor)) for factor in (1, 2, 4, 16)},
}
RETRIEVAL_METHODS = LIBRARY_METHODS


def split_budget(method: str) -> tuple[str, int | None]:
    """``"toolspec@7"`` → ``("toolspec", 7)``: the method with every tree capped at 7 nodes, so
    a fixed cap runs side by side with the run's own budget; ``"toolspec"`` → ``("toolspec",
    None)``."""
    name, mark, nodes = method.partition("@")
    if not mark:
        return method, None
    if not nodes.isdigit() or int(nodes) < 1 or name == BASELINE:
        raise UnknownMethodError(
            f"{method!r}: write a drafting method, '@' and a whole number of draft nodes "
            f"(e.g. toolspec@7)")
    return name, int(nodes)


def parse_methods(spec: str) -> list[str]:
    """``"ar,pld"`` → ``["ar", "pld"]``; ``ar`` is always run (first), as the reference. A
    name may carry a fixed draft budget of its own (``toolspec@7``, see ``split_budget``)."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if split_budget(name)[0] not in METHODS]
    if unknown:
        raise UnknownMethodError(
            f"unknown method(s) {', '.join(unknown)}; available: {', '.join(METHODS)}"
        )
    return [BASELINE] + [name for name in dict.fromkeys(names) if name != BASELINE]
