"""The traffic leader's lease on a real Redis: one holder at a time, renewed only by its holder,
taken over by another process once the holder stops renewing (so a canary outlives its host)."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.leader_lock import LeaderLock
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
