"""The traffic leader's route writes fenced by its lease inside PUT's own step, on a real Valkey
without a stack: two producers' traffic control in one process. The leader checked its lease
just before the write, so one paused between that check and the write still wrote the routes it
had decided on after another producer took the lease over."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from producer_api.traffic_control import TrafficControl
from shared.canary_store import Canary, NotLeading
from shared.job_store import JobStore
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.settings import Settings
from shared.webhook_events import WebhookDispatcher
from tests.conftest import REPO_ROOT

KEYS = Keys("r9-fence:")
TRAFFIC = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
MODEL = "ab"
SEED = Routes({"stable": 100.0, "candidate": 0.0})


@pytest.fixture(autouse=True)
async def _clean(aredis: aioredis.Redis) -> None:
    """Each test starts without the others' routes, canary or lease."""
    keys = [key async for key in aredis.scan_iter(match=f"{KEYS.prefix}*")]
    if keys:
        await aredis.delete(*keys)


def _producer(client: aioredis.Redis, redis_url: str, name: str) -> TrafficControl:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id=name)
    return TrafficControl.build(
        client,
        KEYS,
        settings,
        TRAFFIC,
        JobStore(client, KEYS, 60),
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )


def _pause_before_write(store: RouteStore, successor: LeaderLock) -> None:
    """The store's process pauses past its lease right before PUT runs (after every check made
    before it), and the successor takes the lease over meanwhile."""
    script = store._put

    async def paused(**call: Any) -> Any:
        await store.redis.delete(successor.key)
        assert await successor.hold()
        return await script(**call)

    store._put = paused  # type: ignore[assignment]


async def test_a_leader_paused_before_its_route_write_does_not_write(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The paused leader's step leaves the routes as they were; the new leader takes it, once."""
    first, second = _producer(aredis, redis_url, "first"), _producer(aredis, redis_url, "second")
    await first.route_store.seed(MODEL, SEED)
    assert await first.canaries.start(
        Canary(MODEL, "candidate", "stable", [10.0, 50.0, 100.0], 60.0, 0.05, 1_000.0, 10)
    )
    _pause_before_write(first.route_store, second.lease)

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
