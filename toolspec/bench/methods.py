"""The decoding methods a benchmark can compare, by name.

Each factory builds a fresh drafter for one item; it receives plain decoding's output on that
item (the oracle drafts it, the others ignore it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from toolspec.drafters import Drafter, NoDrafter, OracleDrafter, PromptLookupDrafter

DrafterFactory = Callable[[Sequence[int]], Drafter]

BASELINE = "ar"

METHODS: dict[str, DrafterFactory] = {
    BASELINE: lambda ar_tokens: NoDrafter(),
    "pld": lambda ar_tokens: PromptLookupDrafter(),
    "oracle": lambda ar_tokens: OracleDrafter(ar_tokens),
}


class UnknownMethodError(ValueError):
    """A method name that no factory is registered for."""


def parse_methods(spec: str) -> list[str]:
    """``"ar,pld"`` → ``["ar", "pld"]``; ``ar`` is always run (first), as the reference."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise UnknownMethodError(
            f"unknown method(s) {', '.join(unknown)}; available: {', '.join(METHODS)}"
        )
    return [BASELINE] + [name for name in dict.fromkeys(names) if name != BASELINE]
