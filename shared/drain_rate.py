"""How fast lanes drain, the one reading of the per-second drained counters FINISH keeps
(`{lane}:drained:{second}`): what a 429's Retry-After and a queued job's ETA are derived from;
and how many entries wait undelivered in them, which tells a drain rate that is the workers'
capacity (they had work waiting) from one that is only the arrival rate."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from shared.keys import GROUP, Keys

# KEYS: lanes sharing one hash tag (a partition's two); ARGV[1]: the group. Entries of each no
# consumer has been handed yet (acknowledged ones are deleted, so XLEN - pending), as the
# POSITION script counts them: sent as EVAL, which a cluster pipeline routes without loading.
UNDELIVERED = """
local waiting = {}
for i, stream in ipairs(KEYS) do
  local ok, pel = pcall(redis.call, 'XPENDING', stream, ARGV[1])
  waiting[i] = redis.call('XLEN', stream) - (ok and pel[1] or 0)
end
return waiting
"""


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


async def undelivered(client: aioredis.Redis, lanes: Sequence[Sequence[str]]) -> list[list[int]]:
    """Entries waiting undelivered in each lane, one EVAL per group of lanes that share a hash
    tag (a partition's online and bulk lanes), all in one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        for group in lanes:
            pipe.execute_command("EVAL", UNDELIVERED, len(group), *group, GROUP)
        counts = await pipe.execute()
    return [[max(0, int(count)) for count in group] for group in counts]
