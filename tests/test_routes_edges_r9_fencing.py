"""The traffic leader's route writes fenced by its lease inside PUT's own step, on a real Valkey
without a stack: two producers' traffic control in one process. The leader checked its lease
just before the write, so one paused between that check and the write still wrote the routes it
had decided on after another producer took the lease over. The pause is a route store whose
`put` lets the successor take the lease first: no Redis state set before the step can stand in
(a lease already another's fails the step's `hold()`, r8's test), and tests/reply_dropper.py
loses a reply after the server ran a request, never delays one."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from shared.canary_store import NotLeading
from shared.leader_lock import LeaderLock
from shared.route_store import RouteStore
from shared.routing import Routes
from tests.test_canary_turns import MODEL
from tests.test_traffic_edges_r8_fencing import KEYS, _producer, _started, _TakenOverAtPut

SEED = Routes({"stable": 100.0, "candidate": 0.0})


async def test_a_leader_paused_before_its_route_write_does_not_write(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The paused leader's step leaves the routes as they were; the new leader takes it, once."""
    first, second = _producer(aredis, redis_url, "first"), _producer(aredis, redis_url, "second")
    await _started(first)
    first.controller.routes = _TakenOverAtPut(aredis, second.lease, before=True)

    await first.lead()

    live = (await first.route_store.get_many([MODEL]))[MODEL]
    assert live.version == 1 and live.weights["candidate"] == 0.0, live
    assert len(await first.route_store.history(MODEL)) == 1
    await second.lead()
    live = (await second.route_store.get_many([MODEL]))[MODEL]
    assert live.version == 2 and live.weights["candidate"] == 10.0, live
    canary = await second.canaries.get(MODEL)
    assert canary is not None and (canary.step, canary.weight) == (0, 10.0), canary


async def test_a_fenced_put_writes_only_under_its_own_lease(aredis: aioredis.Redis) -> None:
    """Another's lease: NotLeading, and nothing moves (routes, log, global counter); its own
    lease: written as any PUT. The lease shares the routes' slot, or a cluster refuses the
    script (CROSSSLOT)."""
    assert key_slot(KEYS.traffic_leader.encode()) == key_slot(KEYS.routes(MODEL).encode())
    store = RouteStore(aredis, KEYS)
    await store.seed(MODEL, SEED)
    mine = LeaderLock(aredis, KEYS.traffic_leader, "mine", 5_000)
    theirs = LeaderLock(aredis, KEYS.traffic_leader, "theirs", 5_000)
    assert await theirs.hold()
    before = await store.version()

    with pytest.raises(NotLeading):
        await store.put(MODEL, Routes({"stable": 50.0, "candidate": 50.0}), "me", 1, lease=mine)

    assert (await store.get_many([MODEL]))[MODEL].version == 1
    assert len(await store.history(MODEL)) == 1 and await store.version() == before
    await theirs.release()
    assert await mine.hold()
    assert await store.put(MODEL, Routes({"stable": 50.0, "candidate": 50.0}), "me", 1, mine) == 2
