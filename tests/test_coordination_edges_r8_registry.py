"""Worker heartbeats from hosts whose clocks disagree, on a real Valkey: the registry judges who
is alive by Redis's clock, so a worker running fast no longer drops every other worker from the
list, and one running slow is still listed while its heartbeat lives."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.worker_registry import Heartbeat, WorkerRegistry

SKEW_S = 15.0  # past the registry's TTL either way


async def test_workers_on_clocks_off_by_more_than_the_ttl_are_all_listed(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys("registry-skew:")
    registry = WorkerRegistry(aredis, keys)
    real = time.time_ns
    for name, skew in (("on-time", 0.0), ("slow", -SKEW_S), ("fast", SKEW_S)):
        monkeypatch.setattr(time, "time_ns", lambda skew=skew: real() + int(skew * 1e9))
        await registry.publish(Heartbeat(name, "h", 1, "serving"))
    monkeypatch.setattr(time, "time_ns", real)
    assert [beat.name for beat in await registry.live()] == ["fast", "on-time", "slow"]


async def test_a_worker_silent_past_the_ttl_leaves_the_index(aredis: aioredis.Redis) -> None:
    """The index is pruned still, by Redis's clock: it does not grow with every worker that
    ever beat."""
    keys = Keys("registry-prune:")
    registry = WorkerRegistry(aredis, keys)
    await aredis.zadd(keys.workers, {"long-gone": 1})  # its last beat, long before the TTL
    await registry.publish(Heartbeat("alive", "h", 1, "serving"))
    assert await aredis.zrange(keys.workers, 0, -1) == [b"alive"]
    assert [beat.name for beat in await registry.live()] == ["alive"]
