"""The traffic leader's lease on a real Redis: one holder at a time, renewed only by its holder,
taken over by another process once the holder stops renewing (so a canary outlives its host)."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.app import build_state
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.settings import Settings
from tests.conftest import until_async

KEY = "cv:leader:test"


async def test_one_holder_renews_and_another_takes_over_when_it_stops(
    aredis: aioredis.Redis,
) -> None:
    first, second = (LeaderLock(aredis, KEY, owner, lease_ms=60_000) for owner in ("a", "b"))
    assert await first.hold() and not await second.hold()
    await aredis.pexpire(KEY, 30_000)  # as if half the lease had passed
    assert await first.hold() and not await second.hold()
    assert await aredis.pttl(KEY) > 50_000  # the holder's renewal restored the whole lease
    assert await aredis.get(KEY) == b"a"

    # the holder's last renewal, then silence: the other takes over once the lease runs out
    assert await LeaderLock(aredis, KEY, "a", lease_ms=200).hold()
    await until_async(second.hold, timeout=10, every=0.05)
    assert not await first.hold() and await aredis.get(KEY) == b"b"


async def test_only_the_holder_releases_and_another_takes_over_at_once(
    aredis: aioredis.Redis,
) -> None:
    """A producer that stops in order gives the traffic lease up (another leads at its next
    look, not a lease later); a release by one that does not hold it changes nothing."""
    first, second = (LeaderLock(aredis, KEY, owner, lease_ms=60_000) for owner in ("a", "b"))
    assert await first.hold() and not await second.hold()
    await second.release()
    assert await aredis.get(KEY) == b"a"
    await first.release()
    assert await second.hold() and not await first.hold()


async def test_a_producer_that_stops_gives_up_the_traffic_lease(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A producer restarted in order held the canary/shadow lease a whole lease after it left:
    no canary stepped and no shadow was compared meanwhile."""
    keys = Keys("lease-stop:")
    state = build_state(Settings(redis_url=redis_url, key_prefix=keys.prefix, auth="disabled"))
    try:
        state.traffic.start()
        await until_async(lambda: _exists(aredis, keys.traffic_leader), timeout=30, every=0.05)
        await state.traffic.stop()
        assert not await aredis.exists(keys.traffic_leader)
    finally:
        await state.redis.aclose()


async def _exists(client: aioredis.Redis, key: str) -> bool:
    return bool(await client.exists(key))
