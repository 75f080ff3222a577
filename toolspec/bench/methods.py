"""The decoding methods a benchmark can compare, by name.

A method is built once per run (so a drafter can learn across items) and then asked for the
drafter of each item, given plain decoding's output on that item (the oracle drafts it, the
others ignore it). Library-backed methods share the run's call library, which the benchmark
itself fills after each item (so no method ever sees the current item's own call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.drafters import Drafter, NoDrafter, OracleDrafter, PromptLookupDrafter
from toolspec.drafters.recycling import TokenRecyclingDrafter
from toolspec.drafters.retrieval import RetrievalDrafter, ToolSpecDrafter
from toolspec.drafters.samd import SamDecodingDrafter
from toolspec.drafters.schema import SchemaDrafter
from toolspec.drafters.suffix_decoding import SuffixDecodingDrafter
from toolspec.library import CallLibrary


@dataclass(frozen=True)
class MethodSetup:
    tokenizer: PreTrainedTokenizerBase
    library: CallLibrary | None = None


DrafterForItem = Callable[[Sequence[int]], Drafter]
MethodBuilder = Callable[[MethodSetup], DrafterForItem]

BASELINE = "ar"
ORACLE = "oracle"  # drafts plain decoding's own output: the ceiling of any drafter


class MissingLibraryError(ValueError):
    """A retrieval method was asked for without a call library."""


def _fresh(factory: Callable[[], Drafter]) -> MethodBuilder:
    return lambda setup: lambda ar_tokens: factory()


def _persistent(factory: Callable[[MethodSetup], Drafter]) -> MethodBuilder:
    def build(setup: MethodSetup) -> DrafterForItem:
        drafter = factory(setup)
        return lambda ar_tokens: drafter
    return build


def _library(setup: MethodSetup) -> CallLibrary:
    if setup.library is None:
        raise MissingLibraryError("retrieval methods need a call library (--library DIR)")
    return setup.library


METHODS: dict[str, MethodBuilder] = {
    BASELINE: _fresh(NoDrafter),
    "pld": _fresh(PromptLookupDrafter),
    ORACLE: lambda setup: OracleDrafter,
    # Cross-request learners: one drafter per run; each learns an item's output at its stop().
    "samd": _persistent(lambda s: SamDecodingDrafter()),
    "recycling": _persistent(lambda s: TokenRecyclingDrafter()),
    "suffix": _persistent(lambda s: SuffixDecodingDrafter()),
    # ToolSpec drafts values and free text with `suffix`, the best baseline (docs/baselines.md).
    "toolspec-schema": _persistent(lambda s: SchemaDrafter(s.tokenizer, SuffixDecodingDrafter())),
    # The benchmark fills the library itself (learn=False), after every method ran on an item.
    "toolspec-retrieval": _persistent(lambda s: RetrievalDrafter(
        s.tokenizer, _library(s), SuffixDecodingDrafter(), learn=False)),
    "toolspec": _persistent(lambda s: ToolSpecDrafter(
        s.tokenizer, _library(s), SuffixDecodingDrafter(), learn=False)),
    # Ablation: the full method over the paper's prompt-lookup fallback.
    "toolspec-pld": _persistent(lambda s: ToolSpecDrafter(
        s.tokenizer, _library(s), PromptLookupDrafter(), learn=False)),
}
RETRIEVAL_METHODS = frozenset({"toolspec-retrieval", "toolspec", "toolspec-pld"})


class UnknownMethodError(ValueError):
    """A method name that no builder is registered for."""


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
