"""The decoding methods a benchmark can compare, by name.

A method is built once per run (so a drafter can learn across items) and then asked for the
drafter of each item, given plain decoding's output on that item (the oracle drafts it, the
others ignore it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.drafters import Drafter, NoDrafter, OracleDrafter, PromptLookupDrafter
from toolspec.drafters.schema import SchemaDrafter

DrafterForItem = Callable[[Sequence[int]], Drafter]
MethodBuilder = Callable[[PreTrainedTokenizerBase], DrafterForItem]

BASELINE = "ar"


def _fresh(factory: Callable[[], Drafter]) -> MethodBuilder:
    return lambda tokenizer: lambda ar_tokens: factory()


def _schema(tokenizer: PreTrainedTokenizerBase) -> DrafterForItem:
    drafter = SchemaDrafter(tokenizer, fallback=PromptLookupDrafter())
    return lambda ar_tokens: drafter


METHODS: dict[str, MethodBuilder] = {
    BASELINE: _fresh(NoDrafter),
    "pld": _fresh(PromptLookupDrafter),
    "oracle": lambda tokenizer: OracleDrafter,
    "toolspec-schema": _schema,
}


class UnknownMethodError(ValueError):
    """A method name that no builder is registered for."""


def parse_methods(spec: str) -> list[str]:
    """``"ar,pld"`` → ``["ar", "pld"]``; ``ar`` is always run (first), as the reference."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise UnknownMethodError(
            f"unknown method(s) {', '.join(unknown)}; available: {', '.join(METHODS)}"
        )
    return [BASELINE] + [name for name in dict.fromkeys(names) if name != BASELINE]
