"""How fast lanes drain, the one reading of the per-second drained counters FINISH keeps
(`{lane}:drained:{second}`): what a 429's Retry-After and a queued job's ETA are derived from."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.redis_client import get_many


async def drain_rates(
    client: aioredis.Redis, keys: Keys, streams: Sequence[str], window_s: int
) -> list[float]:
    """Entries each lane finished per second over the last `window_s` complete seconds and the
    part of this one gone by (one round trip): a lane that began draining this second is not
    read as idle, and a partial second does not read as a slow one."""
    now = time.time()
    second = int(now)
    seconds = range(second - window_s, second + 1)
    names = [keys.drained(stream, s) for stream in streams for s in seconds]
    counts = [int(count) if count else 0 for count in await get_many(client, names)]
    span = window_s + now - second
    width = len(seconds)
    return [sum(counts[i * width : (i + 1) * width]) / span for i in range(len(streams))]
