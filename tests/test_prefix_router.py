"""Prefix-aware routing, the ranking alone: a session's replica first, then the
replica known to hold the longest start of the prompt, then the prompt's rendezvous-hash home;
replicas with too long a queue last; replicas that come and go move few prefixes."""

from __future__ import annotations

import random

from ray.serve._private.common import DeploymentID
from ray.serve.request_router import ReplicaID

from deployments.prefix_router import RoutedRequest, RoutingMemory, rank_replicas
from toolspec.core.prefix_cache import block_keys

DEPLOYMENT = DeploymentID(name="ModelServer", app_name="toolspec")


def replicas(count: int) -> list[ReplicaID]:
    return [ReplicaID(unique_id=f"r{i}", deployment_id=DEPLOYMENT) for i in range(count)]


def request(prompt: list[int], session: str | None = None, tenant: str = "t") -> RoutedRequest:
    return RoutedRequest(session, block_keys(tenant, prompt, 4))


def rank(pool: list[ReplicaID], routed: RoutedRequest, memory: RoutingMemory,
         queues: dict[ReplicaID, int] | None = None) -> tuple[list[ReplicaID], str, int]:
    return rank_replicas(pool, queues or {}, routed, memory, anchor_blocks=4,
                         imbalanced_threshold=2)


def test_a_request_goes_where_its_longest_prefix_went() -> None:
    pool, memory = replicas(3), RoutingMemory(1000, 100)
    system = list(range(100, 120))  # five blocks of four
    memory.record(request([*system[:8], 1, 2, 3, 4]), pool[0])  # shares two blocks
    memory.record(request([*system, 5, 6, 7, 8]), pool[2])  # shares all five
    ranked, reason, matched = rank(pool, request([*system, 9, 9, 9, 9]), memory)
    assert ranked[0] == pool[2] and reason == "prefix" and matched == 5
    # Two blocks of six is under the match-rate threshold: pool[0] gets no credit for them.
    assert rank([pool[0], pool[1]], request([*system, 9, 9, 9, 9]), memory)[1] == "home"
    other_tenant = request([*system, 9, 9, 9, 9], tenant="u")
    assert rank(pool, other_tenant, memory)[2] == 0  # nothing of t's is u's


def test_a_session_stays_with_its_replica_unless_its_queue_is_too_long() -> None:
    pool, memory = replicas(3), RoutingMemory(1000, 100)
    memory.record(request([1, 2, 3, 4, 5], session="t/s1"), pool[1])
    turn_two = request([7, 7, 7, 7, 7, 7, 7, 7], session="t/s1")  # a prompt seen nowhere
    assert rank(pool, turn_two, memory)[:2] == ([pool[1], *rank(pool, turn_two, memory)[0][1:]],
                                                "session")
    busy = {pool[1]: 9, pool[0]: 1, pool[2]: 0}
    ranked, reason, _ = rank(pool, turn_two, memory, busy)
    assert ranked[0] != pool[1] and ranked[-1] == pool[1] and reason == "rebalanced"


def test_cold_prompts_spread_over_their_homes_and_a_lost_replica_moves_only_its_own() -> None:
    pool, memory = replicas(4), RoutingMemory(1000, 100)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000) for _ in range(24)] for _ in range(200)]
    homes = [rank(pool, request(p), memory)[0][0] for p in prompts]
    assert {reason for _, reason, _ in (rank(pool, request(p), memory) for p in prompts)} \
        == {"home"}
    counts = [homes.count(r) for r in pool]
    assert min(counts) > 25  # about 50 each
    assert homes == [rank(pool[::-1], request(p), memory)[0][0] for p in prompts]  # any order
    survivors = pool[:3]
    moved = [home for p, home in zip(prompts, homes)
             if rank(survivors, request(p), memory)[0][0] != home]
    assert set(moved) == {pool[3]}  # only the lost replica's prompts move
    grown = [*pool, *replicas(5)[4:]]
    taken = [p for p, home in zip(prompts, homes) if rank(grown, request(p), memory)[0][0] != home]
    assert 10 < len(taken) < 80  # the new replica takes about a fifth, from every other


def test_forgetting_replicas_and_the_bounds_of_memory() -> None:
    pool, memory = replicas(2), RoutingMemory(max_blocks=6, max_sessions=1)
    memory.record(request(list(range(16)), session="t/a"), pool[0])
    memory.record(request(list(range(100, 116)), session="t/b"), pool[1])
    assert len(memory.blocks) <= 6 and list(memory.sessions) == ["t/b"]
    assert memory.matched_blocks(block_keys("t", list(range(100, 116)), 4), pool[1]) == 4
    memory.keep_only({pool[0]})
    assert not memory.sessions and all(pool[1] not in places
                                       for places in memory.blocks.values())


def test_a_shared_header_alone_is_no_reason_to_crowd_a_replica() -> None:
    pool, memory = replicas(2), RoutingMemory(1000, 100)
    header = [1, 2, 3, 4, 5, 6, 7, 8]  # two blocks every request of the tenant starts with
    rng = random.Random(1)
    prompts = [[*header, *(rng.randrange(1000) for _ in range(24))] for _ in range(40)]
    for prompt in prompts:
        ranked, reason, _ = rank(pool, request(prompt), memory)
        assert reason == "home"  # 2 of 8 blocks held is under the match-rate threshold
        memory.record(request(prompt), ranked[0])
    assert len({rank(pool, request(p), memory)[0][0] for p in prompts}) == 2
