"""Every running request's drafter, as vLLM's step loop sees them: by request id, from tokens.

vLLM asks its proposer, once per step, for one draft chain per running request, giving each
request's tokens so far (prompt + output). ``DraftSessions`` keeps one ``DraftSession`` per
request id: the request's drafter from the registry (the same methods, the same per-tenant
memory as the project's own engine), started on the request's prompt and what it brings
(``DraftingRequest``: tools, call format, tenant, past calls), told every token the model
emitted since the last step, asked for its draft tree and cut to the chain vLLM verifies.

A chain is the tree's path with the most expected accepted tokens, each node's acceptance
calibrated by what the model actually accepted from its source so far (``AcceptanceCalibration``,
as the engine's budget does), at most ``max_tokens`` long and ending where a node's reach falls
below ``min_reach`` (a token that is rarely accepted costs a verified row for nothing).

Nothing here imports vLLM: ``toolspec.vllm.proposer`` adapts it to vLLM's proposer interface,
tests drive it with token lists. Failures stay with their request: a drafter that raises drafts
nothing more for that request (logged once), and the others go on.

Mutates: its sessions, the calibration, the call-library mirror, the statistics.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from toolspec.calls.formats import get_format
from toolspec.calls.tools import ToolSet
from toolspec.core.budget import AcceptanceCalibration
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.drafter import Drafter, DraftRequest
from toolspec.library.errors import LibraryError
from toolspec.library.mirror import LibraryMirror
from toolspec.registry import METHODS, DrafterFactory, UnknownMethodError
from toolspec.vllm.request import DraftingRequest

logger = logging.getLogger(__name__)

DEFAULT_METHOD = "toolspec"


@dataclass(frozen=True)
class SessionSettings:
    """``max_tokens``: the longest chain (vLLM's ``num_speculative_tokens``); ``method``: the
    registry method of requests that name none; ``min_reach``: a chain stops before a node
    whose calibrated probability of being reached is lower; ``tree_nodes``: the size of the
    tree the chain is cut from, in chains (a tree of exactly ``max_tokens`` nodes spreads
    them over its branches, and its likeliest path stops short); ``step_tokens``: draft
    tokens one step verifies across all its requests at most (None: no such limit) — on a
    compute-bound machine every verified row costs, and a batch's unlikely tails cost most."""

    max_tokens: int
    method: str = DEFAULT_METHOD
    min_reach: float = 0.3
    tree_nodes: int = 4
    step_tokens: int | None = None
    max_tenants: int = 256

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.method not in METHODS:
            raise UnknownMethodError(f"unknown method {self.method!r}; available: "
                                     f"{', '.join(METHODS)}")
        if not 0.0 <= self.min_reach <= 1.0:
            raise ValueError(f"min_reach must be in [0, 1], got {self.min_reach}")


@dataclass
class ProposerStats:
    """Totals since start (what ``ToolSpecWorkerExtension.toolspec_proposer_stats`` reports).
    Mutates: on every chain proposed and learnt from."""

    requests: int = 0
    failed_requests: int = 0
    chains: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_by_source: Counter[str] = field(default_factory=Counter)
    draft_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed_requests": self.failed_requests,
                "chains": self.chains, "drafted": self.drafted, "accepted": self.accepted,
                "accepted_by_source": dict(self.accepted_by_source),
                "draft_s": round(self.draft_s, 6)}


def _likeliest(chains: Sequence[tuple[DraftTree, Sequence[float]]], budget: int | None
               ) -> list[int]:
    """How many leading tokens of each chain to keep: the ``budget`` likeliest of all (by
    reach; ties to the earlier chain and the earlier token), every chain keeping a prefix
    since its reach never grows along it. None: all of them."""
    lengths = [len(chain) for chain, _ in chains]
    if budget is None or sum(lengths) <= budget:
        return lengths
    ranked = sorted(((-reach, index, position) for index, (_, reaches) in enumerate(chains)
                     for position, reach in enumerate(reaches)))
    kept = [0] * len(chains)
    for _, index, position in ranked[:budget]:
        kept[index] = max(kept[index], position + 1)
    return kept


def best_chain(tree: DraftTree, reach: Sequence[float], max_tokens: int,
               min_reach: float) -> list[int]:
    """The nodes, root's child first, of the path through ``tree`` whose summed ``reach``
    (expected accepted tokens) is largest, at most ``max_tokens`` deep and through nodes whose
    reach is at least ``min_reach``; the shallower path wins a tie. Empty when no node
    qualifies."""
    score: list[float | None] = []
    depth: list[int] = []
    best, best_score = ROOT, 0.0
    for node, parent in enumerate(tree.parents):
        above = 0.0 if parent == ROOT else score[parent]
        depth.append(1 if parent == ROOT else depth[parent] + 1)
        if above is None or depth[node] > max_tokens or reach[node] < min_reach:
            score.append(None)
            continue
        score.append(above + reach[node])
        if score[node] > best_score:
            best, best_score = node, score[node]
    return tree.path_to(best) if best != ROOT else []


class DraftSession:
    """One request's drafter, fed the tokens its request emits. Mutates: its drafter."""

    def __init__(self, drafter: Drafter, request: DraftRequest) -> None:
        self.drafter = drafter
        drafter.start(request)
        self.seen = len(request.prompt_ids)  # tokens of the context the drafter knows
        self.chain = DraftTree()  # the chain proposed last, as vLLM was given it

    def catch_up(self, context: Sequence[int]) -> Sequence[int]:
        """Tell the drafter the tokens emitted since it last looked; returns them."""
        emitted = context[self.seen:]
        if emitted:
            self.drafter.observe(emitted)
            self.seen = len(context)
        return emitted

    def stop(self) -> None:
        self.drafter.stop()


class DraftSessions:
    """The drafters of the requests vLLM runs, keyed by its request ids.

    ``start`` when a request is first seen, ``propose`` each step it decodes, ``retire`` the
    requests no longer running (finished, aborted, preempted: a preempted request starts again
    from its tokens when it comes back). Past calls a request carries go into ``library``, a
    call-library mirror private to this process that retrieval drafts from.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, settings: SessionSettings) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.library = LibraryMirror(prefix="toolspec-vllm-library-")
        self.calibration = AcceptanceCalibration()
        self.stats = ProposerStats()
        self._factories: dict[str, DrafterFactory] = {}
        self._sessions: dict[str, DraftSession] = {}
        self._failed: set[str] = set()

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._sessions or request_id in self._failed

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, request_id: str, prompt_ids: Sequence[int],
              request: DraftingRequest | None) -> None:
        """Begin drafting for ``request_id`` (its prompt and what it carries; None: nothing,
        the default method's fallback drafts for the default tenant). A request that cannot be
        drafted for (an unknown method, tools that do not parse) is logged and left without
        drafts."""
        self.stats.requests += 1
        try:
            self._sessions[request_id] = self._session(prompt_ids, request or DraftingRequest())
        except Exception:  # noqa: BLE001 - a request's drafting never fails its decoding
            self._fail(request_id, "could not start drafting")

    def propose(self, request_id: str, context: Sequence[int], limit: int) -> list[int]:
        """The chain to verify after ``context`` (the request's prompt and every token it
        emitted so far), at most ``limit`` tokens: ``propose_batch`` of one request."""
        return self.propose_batch([(request_id, context, limit)])[0]

    def propose_batch(self, rows: Sequence[tuple[str, Sequence[int], int]]) -> list[list[int]]:
        """One step of many requests (``(request id, context, limit)`` each): every request's
        drafter first learns how much of its last chain the model accepted, then drafts; of
        all the chains, the ``step_tokens`` likeliest draft tokens are verified (a chain's
        tokens grow less likely along it, so each keeps a prefix). Empty for an unknown or
        failed request, or one past its limit."""
        chains: list[tuple[DraftTree, list[float]]] = []
        clock = time.perf_counter()
        for request_id, context, limit in rows:
            chains.append(self._draft(request_id, context, limit))
        kept = _likeliest(chains, self.settings.step_tokens)
        drafts = []
        for (request_id, _, _), (chain, _), keep in zip(rows, chains, kept):
            session = self._sessions.get(request_id)
            if session is not None:
                session.chain = chain.subtree(range(keep))
                if keep:
                    self.stats.chains += 1
                    self.stats.drafted += keep
            drafts.append(list(chain.tokens[:keep]))
        self.stats.draft_s += time.perf_counter() - clock
        return drafts

    def _draft(self, request_id: str, context: Sequence[int], limit: int
               ) -> tuple[DraftTree, list[float]]:
        """One request's chain and its nodes' calibrated reach (empty where it drafts
        nothing); a drafter that raises fails its request (``_fail``)."""
        session = self._sessions.get(request_id)
        if session is None or limit <= 0:
            return DraftTree(), []
        try:
            emitted = session.catch_up(context)
            self._learn(session.chain, emitted)
            session.chain = DraftTree()
            longest = min(limit, self.settings.max_tokens)
            tree = session.drafter.propose(context, longest * self.settings.tree_nodes)
            reach = self.calibration.reach_probabilities(tree)
            nodes = best_chain(tree, reach, longest, self.settings.min_reach)
        except Exception:  # noqa: BLE001 - see ``start``
            self._fail(request_id, "drafting failed")
            return DraftTree(), []
        return tree.subtree(nodes), [reach[node] for node in nodes]

    def retire(self, running: Collection[str]) -> None:
        """Stop the sessions of requests not in ``running`` (their drafters learn into their
        tenant's memory as they stop)."""
        for request_id in [r for r in self._sessions if r not in running]:
            session = self._sessions.pop(request_id)
            try:
                session.stop()
            except Exception:  # noqa: BLE001 - the request is over either way
                logger.exception("a drafter failed to stop (request %s)", request_id)
        self._failed.intersection_update(running)

    def close(self) -> None:
        self.retire(())
        self.library.close()

    # ---- inside ------------------------------------------------------------------------------

    def _factory(self, method: str) -> DrafterFactory:
        factory = self._factories.get(method)
        if factory is None:
            first = next(iter(self._factories.values()), None)
            factory = first.sibling(method) if first is not None else DrafterFactory(
                method, self.tokenizer, self.library.local, self.settings.max_tenants)
            self._factories[method] = factory
        return factory

    def _session(self, prompt_ids: Sequence[int], request: DraftingRequest) -> DraftSession:
        tools = ToolSet.from_openai(request.tools) if request.tools else None
        call_format = get_format(request.call_format) if request.call_format else None
        if request.past_calls:
            try:
                self.library.keep_exported(request.past_calls)
            except LibraryError as error:  # drafting goes on with what the mirror holds
                logger.warning("past calls not kept for drafting: %s", error)
        drafter = self._factory(request.method or self.settings.method).for_request(
            request.tenant, tools is not None)
        return DraftSession(drafter, DraftRequest(tuple(prompt_ids), tools, call_format,
                                                  request.conversation, request.tenant))

    def _learn(self, chain: DraftTree, emitted: Sequence[int]) -> None:
        """How much of ``chain`` the model accepted (the emitted tokens it starts; the last
        emitted token is the model's own), into the calibration and the statistics."""
        if not chain or not emitted:
            return
        accepted = 0
        for drafted, token in zip(chain.tokens, emitted[:-1]):
            if drafted != token:
                break
            accepted += 1
        self.calibration.observe(chain, tuple(range(accepted)))
        self.stats.accepted += accepted
        self.stats.accepted_by_source.update(chain.sources[:accepted])

    def _fail(self, request_id: str, what: str) -> None:
        logger.exception("%s for request %s; it decodes without drafts", what, request_id)
        self.stats.failed_requests += 1
        session = self._sessions.pop(request_id, None)
        self._failed.add(request_id)
        if session is not None:
            try:
                session.stop()
            except Exception:  # noqa: BLE001 - already failing
                pass
