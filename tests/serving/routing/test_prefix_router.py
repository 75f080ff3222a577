"""Prefix-aware routing: the ranking (a session's replica first, then the replica known to
hold the longest start of the prompt, then the rendezvous-hash home of the prompt's opening;
replicas with too long a queue last; replicas that come and go move few prefixes), and the
``PrefixAwareRouter`` as Ray Serve drives it (its hooks, its decisions, its replicas coming and
going), two of them standing for two ingress replicas."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve._private.test_utils import FakeRunningReplica
from ray.serve.request_router import PendingRequest, ReplicaID

from deployments.messages import ChatRequest
from deployments.routing.prefix_router import (
    PrefixAwareRouter,
    RoutedRequest,
    RoutingMemory,
    opening_anchor,
    rank_replicas,
)
from toolspec.core.prefix_cache import DEFAULT_BLOCK_TOKENS, block_keys

DEPLOYMENT = DeploymentID(name="ModelServer", app_name="toolspec")


def replicas(count: int) -> list[ReplicaID]:
    return [ReplicaID(unique_id=f"r{i}", deployment_id=DEPLOYMENT) for i in range(count)]


def request(prompt: list[int], session: str | None = None, tenant: str = "t") -> RoutedRequest:
    """A prompt of its own conversation: its opening is the whole prompt."""
    return RoutedRequest(session, block_keys(tenant, prompt, 4),
                         opening_anchor(tenant, (), [{"role": "user", "content": str(prompt)}]))


def rank(pool: list[ReplicaID], routed: RoutedRequest, memory: RoutingMemory,
         queues: dict[ReplicaID, int] | None = None) -> tuple[list[ReplicaID], str, int]:
    return rank_replicas(pool, queues or {}, routed, memory, imbalanced_threshold=2)


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


# ---- the router as Ray Serve drives it --------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
_ids = iter(range(1_000_000))


def router(pool: list[FakeRunningReplica], **kwargs: Any) -> PrefixAwareRouter:
    """A router as Serve makes one in an ingress replica's handle, told its replicas (on the
    running event loop, as Serve does)."""
    made = PrefixAwareRouter(deployment_id=DEPLOYMENT,
                             handle_source=DeploymentHandleSource.REPLICA)
    made.initialize_state(**kwargs)
    made.update_replicas(pool)
    return made


def pending(messages: list[dict[str, Any]], prompt: list[int], session: str = "",
            tenant: str = "acme") -> PendingRequest:
    """A ``ModelServer.generate`` call as the ingress sends it: the admitted request, its
    prompt rendered (``prompt`` tokens), its session in the metadata."""
    chat = ChatRequest(f"req-{next(_ids)}", "m", tuple(messages), openai_tools=(WEATHER,),
                       tenant=tenant, prompt_ids=tuple(prompt))
    metadata = RequestMetadata(request_id=chat.request_id, internal_request_id=chat.request_id,
                               session_id=session, call_method="generate")
    return PendingRequest(args=[chat], kwargs={}, metadata=metadata)


async def route(by: PrefixAwareRouter, pool: list[FakeRunningReplica], call: PendingRequest,
                taken: int = 0) -> FakeRunningReplica:
    """Serve's part: rank, send to the ``taken``-th choice (the ones before it full), tell."""
    ranked = await by.choose_replicas(pool, call)
    assert call.routing_context.should_backoff  # once every replica is full, back off
    chosen = ranked[taken][0]
    by.on_request_routed(call, chosen.replica_id, None)
    return chosen


def conversation(index: int, rng: random.Random) -> tuple[list[dict[str, Any]], list[int],
                                                            list[dict[str, Any]], list[int]]:
    """A short conversation's two turns (3 to 7 blocks: under the 16 the old anchor took):
    the messages and rendered prompt of each; the second repeats the first and adds to it."""
    first = [{"role": "user", "content": f"Weather in city number {index}?"}]
    prompt = [rng.randrange(1000) for _ in range(rng.randrange(3, 8) * DEFAULT_BLOCK_TOKENS + 5)]
    second = [*first, {"role": "assistant", "content": "Let me look."},
              {"role": "user", "content": "And tomorrow?"}]
    return first, prompt, second, [*prompt, *(rng.randrange(1000) for _ in range(70))]


def test_a_short_conversations_next_turn_reaches_its_replica_through_another_ingress() -> None:
    """Two ingress replicas, each with its own router and memory: a conversation's first
    turn through one, its second through the other, lands where the first did (the old
    anchor, the key of a short prompt's last block, sent 143 of 200 elsewhere)."""
    async def scenario() -> tuple[int, set[ReplicaID], PrefixAwareRouter]:
        pool = [FakeRunningReplica(f"r{i}") for i in range(4)]
        first_ingress, second_ingress = router(pool), router(pool)
        rng = random.Random(5)
        moved, homes = 0, set()
        for index in range(100):
            first, prompt, second, longer = conversation(index, rng)
            went = await route(first_ingress, pool, pending(first, prompt, f"s{index}"))
            came = await route(second_ingress, pool, pending(second, longer, f"s{index}"))
            moved += came is not went
            homes.add(went.replica_id)
        return moved, homes, second_ingress

    moved, homes, second_ingress = asyncio.run(scenario())
    assert moved == 0
    assert len(homes) == 4  # conversations of their own spread over every replica
    assert second_ingress.reasons == {"home": 100}


def test_the_router_ranks_by_session_then_prefix_then_home_and_learns_where_each_went() -> None:
    async def scenario() -> None:
        pool = [FakeRunningReplica(f"r{i}") for i in range(3)]
        made = router(pool, imbalanced_threshold=2)
        assert await made.choose_replicas([], None) == []
        assert await made.choose_replicas(pool, None) == [pool]  # no request: any
        rng = random.Random(1)
        system = [{"role": "system", "content": "You call tools."}]
        shared = [rng.randrange(1000) for _ in range(6 * DEFAULT_BLOCK_TOKENS)]
        home = await route(made, pool, pending(system, [*shared, 1, 2, 3], "a"))
        # Another session, the same system prompt and tools: the same blocks, the same home.
        assert await route(made, pool, pending(system, [*shared, 4, 5], "b")) is home
        assert made.reasons == {"home": 1, "prefix": 1}
        # Its first choice full, a request goes to the next; the router learns where it went.
        elsewhere = await route(made, pool, pending(system, [*shared, 6], "c"), taken=1)
        assert elsewhere is not home and made.reasons["fallback"] == 1
        unrelated = [{"role": "user", "content": "unrelated"}]
        assert await route(made, pool, pending(unrelated, [7] * 40, "c")) is elsewhere
        assert made.reasons["session"] == 1
        # A replica whose queue is too long is passed over, even for its session.
        made._replica_queue_len_cache.update(elsewhere.replica_id, 9)
        assert await route(made, pool, pending(unrelated, [7] * 40, "c")) is not elsewhere
        assert made.reasons["rebalanced"] == 1

    asyncio.run(scenario())


def test_replicas_that_go_are_forgotten_and_their_prompts_find_new_homes() -> None:
    async def scenario() -> None:
        pool = [FakeRunningReplica(f"r{i}") for i in range(3)]
        made = router(pool)
        rng = random.Random(2)
        calls = [conversation(index, rng)[:2] for index in range(30)]
        went = [await route(made, pool, pending(messages, prompt, f"s{index}"))
                for index, (messages, prompt) in enumerate(calls)]
        lost = went[0]
        survivors = [replica for replica in pool if replica is not lost]
        made.update_replicas(survivors)  # Serve's new replica set: the lost one's memory goes
        assert all(lost.replica_id not in places for places in made._places.blocks.values())
        for index, (messages, prompt) in enumerate(calls):
            now = await route(made, survivors, pending(messages, prompt, f"s{index}"))
            assert now is went[index] or went[index] is lost  # only the lost one's moved
        dead = survivors[0]
        made.on_replica_actor_died(dead.replica_id)
        assert all(dead.replica_id not in places for places in made._places.blocks.values())
        assert dead.replica_id not in made._places.sessions.values()

    asyncio.run(scenario())


def test_a_decision_never_routed_is_forgotten_past_the_bound() -> None:
    async def scenario() -> int:
        pool = [FakeRunningReplica("r0")]
        made = router(pool)
        for index in range(10_050):  # ranked, never routed (their callers gave up)
            await made.choose_replicas(pool, pending([], [index % 50]))
        return len(made._decisions)

    assert asyncio.run(scenario()) == 10_000
