"""The drafter lifecycle every draft source follows.

A drafter is a pure CPU object with no model inside: ``start`` once per request, then per
verification step ``propose`` a DraftTree for what follows the context and ``observe`` the tokens
the step emitted, and ``stop`` at the end. It can be tested with a toy vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from toolspec.calls.formats import CallFormat
from toolspec.calls.output import RequestOutput
from toolspec.calls.tools import ToolSet
from toolspec.core.draft_tree import DraftTree


@dataclass(frozen=True)
class DraftRequest:
    """What a drafter learns about a request when it starts.

    ``tools`` and ``call_format`` are set for tool-calling requests: the tools the model may
    call and the wire format its calls will be written in. ``conversation`` is the text of the
    user-visible messages (what argument values are usually copied from). ``tenant`` names whose
    past calls may be drafted (libraries keep tenants apart). ``output``: the request's one
    reading of its output, which whoever decodes appends to (the engine's job) and drafters only
    read; None where a drafter is driven alone (it then reads the tokens it observes itself).
    """

    prompt_ids: tuple[int, ...]
    tools: ToolSet | None = None
    call_format: CallFormat | None = None
    conversation: str = ""
    tenant: str = "default"
    output: RequestOutput | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft trees for one request at a time."""

    name: str

    def start(self, request: DraftRequest) -> None:
        """Begin a request. Mutates: the drafter's per-request state (reset)."""

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        """Draft what follows ``context`` (prompt + every emitted token), at most ``budget`` nodes.

        A drafter that merges several drafters' trees may return up to ``budget`` nodes from
        each (never a path deeper than ``budget``): the engine's ``DraftBudget`` then picks what
        is verified, by calibrated acceptance. Must not mutate ``context``.
        """

    def observe(self, emitted: Sequence[int]) -> None:
        """The tokens the last step emitted (accepted drafts + the bonus token), in order.

        Mutates: the drafter's per-request state.
        """

    def stop(self) -> None:
        """End the request; release per-request state."""


@runtime_checkable
class ContextDrafter(Protocol):
    """A drafter whose drafts depend on the context it is given, which may be hypothetical.

    ``propose_after`` may be asked about a context that runs past the tokens emitted so far (a
    draft tree's leaf, say), to draft what would follow it there; it reads nothing but that
    context and what the drafter learned before this step. Mutates: nothing.
    """

    def propose_after(self, context: Sequence[int], budget: int) -> DraftTree:
        """Draft what follows ``context``, at most ``budget`` nodes; like ``propose``, without
        touching the drafter's state."""


def context_drafter(drafter: object) -> ContextDrafter | None:
    """``drafter`` as a ``ContextDrafter`` if it is one, else None."""
    return drafter if isinstance(drafter, ContextDrafter) else None


class NoDrafter:
    """Proposes nothing: the engine then decodes one token per step (plain autoregressive)."""

    name = "ar"

    def start(self, request: DraftRequest) -> None:
        pass

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return DraftTree()

    def observe(self, emitted: Sequence[int]) -> None:
        pass

    def stop(self) -> None:
        pass
