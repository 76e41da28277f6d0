"""The traffic leader fenced by its lease, on a real Valkey without a stack: two producers'
traffic control in one process. A leader paused past its 5 s lease (a GC pause, SIGSTOP, a
slow Redis) after `hold()` used to decide once more after another producer took the lease over,
so two leaders stepped one canary; and a `hold()` that raised left the canary gauges of a
producer that no longer knew it led."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.exceptions import ResponseError

from producer_api.traffic_control import TrafficControl
from shared.job_store import JobStore
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.settings import Settings
from shared.webhook_events import WebhookDispatcher
from tests.test_canary_turns import MODEL, TRAFFIC, _canary

KEYS = Keys("r8-fence:")


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


class _PausedAfterHold(LeaderLock):
    """The first leader's lease, which lapses right after it was held (the process paused past
    it), and the second producer takes it over meanwhile."""

    def __init__(self, client: aioredis.Redis, lease: LeaderLock, successor: LeaderLock) -> None:
        super().__init__(client, lease.key, lease.owner, lease.lease_ms)
        self.client = client
        self.successor = successor

    async def hold(self) -> bool:
        held = await super().hold()
        await self.client.delete(self.key)  # lapsed during the pause
        assert await self.successor.hold()
        return held


class _TakenOverAtPut(RouteStore):
    """The first leader's route store: its process pauses past the lease at the step's route
    write, right before PUT runs (`before`: after every check made before it, `put` making none
    before its script) or between it and the step's save, and the second producer takes the
    lease over meanwhile."""

    def __init__(self, client: aioredis.Redis, successor: LeaderLock, before: bool) -> None:
        super().__init__(client, KEYS)
        self.successor = successor
        self.before = before

    async def put(
        self,
        model: str,
        routes: Routes,
        by: str,
        expected: int | None = None,
        lease: LeaderLock | None = None,
    ) -> int:
        if self.before:
            await self._taken_over()
        written = await super().put(model, routes, by, expected, lease)
        if not self.before:
            await self._taken_over()
        return written

    async def _taken_over(self) -> None:
        await self.redis.delete(KEYS.traffic_leader)  # lapsed during the pause
        assert await self.successor.hold()


async def _started(first: TrafficControl) -> None:
    await first.route_store.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await first.canaries.start(_canary())


async def _kinds(traffic: TrafficControl) -> list[str]:
    return [event["type"] for event in await traffic.canaries.events(MODEL, 10)]


async def test_a_leader_paused_past_its_lease_does_not_step(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """Its look after the pause is refused (no route write, no save, no event), and the new
    leader takes the step, once."""
    first, second = _producer(aredis, redis_url, "first"), _producer(aredis, redis_url, "second")
    await _started(first)
    first.lease = _PausedAfterHold(aredis, first.lease, second.lease)

    await first.lead()

    canary = await first.canaries.get(MODEL)
    assert canary is not None and (canary.step, canary.weight) == (-1, 0.0), canary
    live = (await first.route_store.get_many([MODEL]))[MODEL]
    assert live.weights["candidate"] == 0.0 and live.version == 1, live
    assert await _kinds(first) == []
    await second.lead()
    canary = await second.canaries.get(MODEL)
    assert canary is not None and (canary.step, canary.weight) == (0, 10.0), canary
    assert await _kinds(second) == ["step"]


async def test_a_leader_that_lost_its_lease_mid_step_does_not_save_it(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The lease lapses between the step's route write and its save: the save is refused in
    the script that checks the lease, and the new leader takes the step up from the routes."""
    first, second = _producer(aredis, redis_url, "first"), _producer(aredis, redis_url, "second")
    await _started(first)
    first.controller.routes = _TakenOverAtPut(aredis, second.lease, before=False)

    await first.lead()

    canary = await first.canaries.get(MODEL)
    assert canary is not None and canary.step == -1, canary
    assert await _kinds(first) == []
    await second.lead()
    canary = await second.canaries.get(MODEL)
    assert canary is not None and (canary.step, canary.weight) == (0, 10.0), canary
    assert await _kinds(second) == ["step"]


async def test_a_hold_that_fails_hides_the_canary_gauges(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """A producer that cannot tell whether it still leads exports no canary gauges."""
    first = _producer(aredis, redis_url, "first")
    await _started(first)
    await first.lead()
    labels = {"model": MODEL, "variant": "candidate"}
    assert REGISTRY.get_sample_value("conveyor_canary_weight", labels) == 10.0

    await aredis.delete(KEYS.traffic_leader)
    await aredis.rpush(KEYS.traffic_leader, "not a lease")  # GET on it raises WRONGTYPE
    with pytest.raises(ResponseError):
        await first.lead()

    assert REGISTRY.get_sample_value("conveyor_canary_weight", labels) is None
