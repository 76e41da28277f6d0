"""The one place that creates consumer groups: at id 0, so entries added before any worker
existed are served, keeping a group that exists already (BUSYGROUP) as it is. The producer
creates every partition's groups up front (so lag is measurable before any worker runs); a
worker creates its own at start and again when Redis lost them (NOGROUP)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.keys import GROUP
from shared.redis_client import WRITES_REFUSED

log = logging.getLogger(__name__)
T = TypeVar("T")
# KEYS[1]=stream; ARGV: group, consumer. Deletes the consumer if it owns no pending entry now,
# in one step: DELCONSUMER drops the consumer's pending entries with it, and between a look at
# its pending count and the delete a read may hand it entries, which then no one would reclaim.
DELETE_IF_IDLE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS[1]=stream; ARGV: group, consumer, entry ids. Re-claims (XCLAIM JUSTID: idle reset,
# delivery count kept) the entries the consumer still owns, so no reclaimer takes a long run for
# an abandoned one; returns the others: taken over by another consumer (this one could not reach
# Redis for a visibility timeout) or no longer pending (acknowledged by whoever reran them). A
# plain XCLAIM took such an entry back, and two workers ran the job, its tokens interleaved.
TOUCH = """
local lost = {}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""


# KEYS[1]=stream, KEYS[2]=the call's reply, kept for its rerun; ARGV: group, consumer, idle_ms
# (the visibility timeout), ms the reply is kept, entry ids. Hands back entries the consumer
# gave up unfinished at a drain (a generation outlasting the stop's grace): each it still owns
# is made idle past the visibility timeout, with the given-up delivery uncounted (XCLAIM IDLE,
# RETRYCOUNT one less, JUSTID), so the next reclaim anywhere (a rolling update's new worker at
# its start) takes it, where it waited out the whole timeout, and two graceful restarts no
# longer dead-letter a healthy job. Returns how many it handed back. A rerun (the client resends
# a script whose reply was lost) answers the first run's count and lowers nothing again: it
# found the entries still this consumer's, and a job already redelivered ran once more than
# `max_deliveries` allows.
HAND_BACK = """
local kept = redis.call('GET', KEYS[2])
if kept then return tonumber(kept) end
local handed = 0
for i = 5, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == ARGV[2] then
    local count = math.max(tonumber(row[4]) - 1, 0)
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3],
      'RETRYCOUNT', count, 'JUSTID')
    handed = handed + 1
  end
end
redis.call('SET', KEYS[2], handed, 'PX', ARGV[4])
return handed
"""


async def ensure_groups(client: aioredis.Redis, streams: Iterable[str]) -> None:
    for stream in streams:
        try:
            await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except WRITES_REFUSED:
            if not await _has_group(client, stream):
                raise
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


async def _has_group(client: aioredis.Redis, stream: str) -> bool:
    """Whether `stream` has the group: a Redis refusing writes (its maxmemory, a failover's old
    master) refuses XGROUP CREATE before it looks for the group, so a worker or producer that
    started then waited for writes it did not need."""
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no such key
        return False
    return any(group["name"] in (GROUP, GROUP.encode()) for group in groups)


async def ensure_groups_where_streams_fit(client: aioredis.Redis, streams: Iterable[str]) -> None:
    """`ensure_groups` on each stream, skipping (and logging) those whose key holds another
    type (WRONGTYPE: an operator's slip): that partition cannot queue a job, the others can.
    One such key kept a producer's whole startup from running, and so every producer unready,
    every model's requests refused."""
    for stream in streams:
        try:
            await ensure_groups(client, [stream])
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            log.error("%s holds no stream, so its partition serves nothing: %s", stream, exc)


async def recreating_groups(
    client: aioredis.Redis, streams: Sequence[str], call: Callable[[], Awaitable[T]]
) -> T | None:
    """`call`, or None when its lanes' group or stream had vanished (NOGROUP, or XINFO's `no
    such key`: an operator's DEL, a Redis back without its data), after creating them again: a
    worker goes on instead of dying."""
    try:
        return await call()
    except ResponseError as exc:
        if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
            raise
    log.warning("consumer group missing on %s; recreating", ", ".join(streams))
    await ensure_groups(client, streams)
    return None
