"""How fast lanes drain, the one reading of the per-second drained counters FINISH keeps
(`{lane}:drained:{second}`): what a 429's Retry-After and a queued job's ETA are derived from."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from shared.keys import Keys


async def drain_rates(
    client: aioredis.Redis, keys: Keys, streams: Sequence[str], window_s: int
) -> list[float]:
    """Entries each lane finished per second over the last `window_s` complete seconds and the
    part of this one gone by (one round trip): a lane that began draining this second is not
    read as idle, and a partial second does not read as a slow one. A lane's counters share its
    hash tag, so each lane is one MGET (sent as a raw command: a cluster pipeline refuses its
    `mget`, made for keys of any slot), and a cluster pipeline sends each node its lanes at once."""
    now = time.time()
    second = int(now)
    seconds = range(second - window_s, second + 1)
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.execute_command("MGET", *(keys.drained(stream, s) for s in seconds))
        lanes = await pipe.execute()
    span = window_s + now - second
    return [sum(int(count) for count in counts if count) / span for counts in lanes]
