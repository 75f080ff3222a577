"""Prefix-aware routing for the model replicas, through Ray Serve's request-router API.

A replica's prefix cache (``toolspec.core.prefix_cache``) holds the prompt blocks its requests
computed, per tenant. A request is worth most on the replica that already holds the longest
start of its prompt — the tenant's system prompt and tools, a conversation's earlier turns — so
``PrefixAwareRouter`` (set as the ``ModelServer`` deployment's ``request_router_class``) ranks
the replicas for each request:

1. the replica its session went to last (a session stays where its conversation is cached);
2. the most of its prompt's leading blocks (the same chained block keys the replicas use,
   computed here from the prompt tokens the ingress already rendered) routed to a replica
   recently, if that is at least ``match_rate_threshold`` of them (a chat template's fixed
   header, common to every request, is no reason to crowd one replica);
3. for a prompt no replica has seen, its *home*: the replica with the highest rendezvous hash
   of the prompt's anchor, so every ingress replica sends the same cold prefix to the same
   replica without sharing state, and replicas that come and go move only the prefixes they
   take or held. The anchor is the prompt's opening — its tenant, its tools and its first
   message (the system prompt where there is one): what its leading blocks render, and what
   every turn of a conversation repeats, whatever its length. (The key of its first N blocks
   would not do: for a prompt shorter than N blocks it is the key of its last block, which
   the next turn moves, so another ingress replica, which has no memory of the conversation,
   would send the next turn elsewhere.)

A replica whose queue is longer than the shortest by more than ``imbalanced_threshold`` is
passed over (Ray Serve LLM's prefix-aware router does the same): affinity never piles a
queue onto one replica while another idles. Ray Serve then sends the request to the first
ranked replica with room (it probes queue lengths and backs off when all are full).

Why not Ray's ``PrefixCacheAffinityRouter``: it matches prompt *text* (tenant-blind) in a
detached actor asked synchronously on every request; here the match is on the token blocks the
replicas actually key their caches by, tenant-scoped by construction, with no remote call on
the routing path. What each router instance learned is its own; the rendezvous hash keeps
cold routing consistent across ingress replicas.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from deployments.ops import metrics
from toolspec.core.prefix_cache import DEFAULT_BLOCK_TOKENS, block_keys

logger = logging.getLogger(f"ray.serve.{__name__}")

PREFIX_ROUTER = "deployments.routing.prefix_router:PrefixAwareRouter"


class PrefixAwareRouter(RequestRouter):
    """Ranks replicas by session, cached prefix, then rendezvous hash (see the module).

    Kwargs (``request_router_kwargs``): ``imbalanced_threshold`` (queued requests a replica
    may have beyond the least loaded one and still be chosen for affinity),
    ``match_rate_threshold`` (the share of a prompt's blocks a replica must be known to hold
    to be chosen for them), ``remembered_blocks`` and ``remembered_sessions`` (what the router
    keeps, least recently used dropped first), ``block_tokens`` (the replicas' prefix-cache
    block size). ``reasons`` counts its decisions by reason (as ``toolspec_routing_decisions``
    does). Mutates: its own memory of what went where.
    """

    def initialize_state(self, imbalanced_threshold: int = 4, match_rate_threshold: float = 0.5,
                         remembered_blocks: int = 200_000, remembered_sessions: int = 50_000,
                         block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if imbalanced_threshold < 0 or block_tokens < 1 or not 0 <= match_rate_threshold <= 1:
            raise ValueError("imbalanced_threshold must be >= 0, block_tokens >= 1, "
                             "match_rate_threshold in [0, 1]")
        self._imbalanced_threshold = imbalanced_threshold
        self._match_rate_threshold = match_rate_threshold
        self._block_tokens = block_tokens
        self._places = RoutingMemory(remembered_blocks, remembered_sessions)
        # Per request being routed: why its first choice was first, and what routing read.
        self._decisions: OrderedDict[str, _Decision] = OrderedDict()
        self.reasons: Counter[str] = Counter()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is None:
            return [candidate_replicas]
        pending_request.routing_context.should_backoff = True  # back off once all are full
        request = routed_request(pending_request, self._block_tokens)
        queues = {r.replica_id: self._replica_queue_len_cache.get(r.replica_id) or 0
                  for r in candidate_replicas}
        ranked, reason, matched = rank_replicas(
            [r.replica_id for r in candidate_replicas], queues, request, self._places,
            self._imbalanced_threshold, self._match_rate_threshold)
        by_id = {r.replica_id: r for r in candidate_replicas}
        self._remember_decision(pending_request, _Decision(reason, ranked[0], matched, request))
        return [[by_id[replica_id]] for replica_id in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        decision = self._decisions.pop(pending_request.metadata.internal_request_id, None)
        if decision is None:  # routed without a ranking of ours (or one since forgotten)
            decision = _Decision("unranked", None, 0,
                                 routed_request(pending_request, self._block_tokens))
        self._places.record(decision.request, replica_id)
        reason, matched = decision.reason, decision.matched
        if decision.first is not None and replica_id != decision.first:
            reason, matched = "fallback", 0  # the first choice was full: it went elsewhere
        self.reasons[reason] += 1
        metrics.record_routing(reason, matched, len(decision.request.keys))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._places.forget_replica(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._places.keep_only(set(self._replica_id_set))

    def _remember_decision(self, pending_request: PendingRequest, decision: _Decision) -> None:
        self._decisions[pending_request.metadata.internal_request_id] = decision
        while len(self._decisions) > 10_000:  # decisions whose request never got routed
            self._decisions.popitem(last=False)


class RoutedRequest:
    """What routing reads of a request: its session, its prompt's block keys (chained over
    its tenant, as the replicas' prefix caches key them; a request the ingress did not
    tokenize has one key, its anchor), and its anchor (see ``opening_anchor``)."""

    def __init__(self, session: str | None, keys: Sequence[bytes], anchor: bytes) -> None:
        self.session = session
        self.keys = list(keys)
        self.anchor = anchor


@dataclass(frozen=True)
class _Decision:
    reason: str
    first: ReplicaID | None
    matched: int
    request: RoutedRequest


def routed_request(pending_request: PendingRequest, block_tokens: int) -> RoutedRequest:
    request = pending_request.args[0] if pending_request.args else None
    tenant = str(getattr(request, "tenant", "default"))
    session_id = pending_request.metadata.session_id or getattr(request, "session_id", None)
    session = f"{tenant}/{session_id}" if session_id else None
    anchor = opening_anchor(tenant, getattr(request, "openai_tools", None) or (),
                            getattr(request, "messages", ()))
    prompt = getattr(request, "prompt_ids", None)
    keys = block_keys(tenant, prompt, block_tokens) if prompt else []
    # No rendered prompt (or one shorter than a block): its anchor stands for its blocks.
    return RoutedRequest(session, keys or [anchor], anchor)


def opening_anchor(tenant: str, tools: Sequence[Any], messages: Sequence[Any]) -> bytes:
    """The key a cold prompt's home is hashed from: its tenant, its tools and its first
    message (the system prompt where there is one) — where every turn of a conversation, and
    every conversation of an application, starts."""
    opening = json.dumps([tenant, list(tools), list(messages[:1])], sort_keys=True,
                         ensure_ascii=False, default=str)
    return hashlib.blake2b(opening.encode(), digest_size=16).digest()


class RoutingMemory:
    """Which replica each session and each prompt block went to lately (least recently used
    forgotten first). Mutates: itself."""

    def __init__(self, max_blocks: int, max_sessions: int) -> None:
        self.max_blocks = max_blocks
        self.max_sessions = max_sessions
        self.blocks: OrderedDict[bytes, set[ReplicaID]] = OrderedDict()
        self.sessions: OrderedDict[str, ReplicaID] = OrderedDict()

    def record(self, request: RoutedRequest, replica: ReplicaID) -> None:
        for key in reversed(request.keys):  # parents end up more recent than their children
            self.blocks.setdefault(key, set()).add(replica)
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)
        if request.session is not None:
            self.sessions[request.session] = replica
            self.sessions.move_to_end(request.session)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)

    def matched_blocks(self, keys: Sequence[bytes], replica: ReplicaID) -> int:
        """How many of ``keys``, from the first on, went to ``replica``."""
        count = 0
        for key in keys:
            if replica not in self.blocks.get(key, ()):
                break
            count += 1
        return count

    def forget_replica(self, replica: ReplicaID) -> None:
        self.keep_only(None, drop=replica)

    def keep_only(self, replicas: set[ReplicaID] | None, drop: ReplicaID | None = None) -> None:
        """Forget replicas that are gone (not in ``replicas``, or ``drop``)."""
        def gone(replica: ReplicaID) -> bool:
            return replica == drop or (replicas is not None and replica not in replicas)

        for session in [s for s, r in self.sessions.items() if gone(r)]:
            del self.sessions[session]
        for key in list(self.blocks):
            places = self.blocks[key]
            stale = {r for r in places if gone(r)}
            if stale:
                places -= stale
                if not places:
                    del self.blocks[key]


def rank_replicas(replicas: Sequence[ReplicaID], queues: dict[ReplicaID, int],
                  request: RoutedRequest, places: RoutingMemory, imbalanced_threshold: int,
                  match_rate_threshold: float = 0.5) -> tuple[list[ReplicaID], str, int]:
    """``replicas`` best first for ``request``, why the first is first (``session``,
    ``prefix``, ``home``, or ``rebalanced`` when its best place's queue was too long), and
    how many prompt blocks it is known to hold.
    Replicas within ``imbalanced_threshold`` of the shortest queue come first, by session,
    then matched blocks (counted where they are at least ``match_rate_threshold`` of the
    prompt's), then the rendezvous hash of the prompt's anchor; the rest follow by queue
    length."""
    anchor = request.anchor
    session_replica = places.sessions.get(request.session) if request.session else None
    shortest = min(queues.get(r, 0) for r in replicas)
    matched = {r: places.matched_blocks(request.keys, r) for r in replicas}
    enough = match_rate_threshold * len(request.keys)

    def affinity(replica: ReplicaID) -> tuple[int, int, int]:
        held = matched[replica] if matched[replica] >= enough else 0
        return (replica == session_replica, held, _rendezvous(anchor, replica))

    balanced = [r for r in replicas if queues.get(r, 0) <= shortest + imbalanced_threshold]
    loaded = [r for r in replicas if r not in balanced]
    ranked = sorted(balanced, key=affinity, reverse=True) + \
        sorted(loaded, key=lambda r: (queues.get(r, 0), -_rendezvous(anchor, r)))
    first = ranked[0]
    if first != max(replicas, key=affinity):
        reason = "rebalanced"  # its best place had too long a queue
    elif first == session_replica:
        reason = "session"
    elif matched[first] >= enough and matched[first]:
        reason = "prefix"
    else:
        reason = "home"
    return ranked, reason, matched[first]


def _rendezvous(anchor: bytes, replica: ReplicaID) -> int:
    """Highest-random-weight hash: the replica with the largest value is the anchor's home;
    removing a replica moves only the anchors it was home to."""
    digest = hashlib.blake2b(anchor + replica.unique_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
