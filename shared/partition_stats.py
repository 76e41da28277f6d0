"""Queue state of every partition and lane, read in two pipelined round trips however many
models there are (XINFO GROUPS + XLEN + the fair lane's held count, then the OLDEST script for
each lane with jobs waiting): what `GET /v1/models` shows and what the Prometheus gauges report.
A fair lane's flood waits outside its stream (held back per tenant), so its held jobs count as
waiting in `lag` and in the oldest age, or a lag alert stayed quiet while a backlog built.
An error reply other than a lane's "no such key" is raised, as one server's outage is: a cluster
pipeline returns each node's errors (a master failing over, loading, frozen) as its commands'
replies, which were read as 0 and dropped the gauges of that master's partitions to 0 mid-outage,
clearing their alerts, where the metrics route keeps the last values of a read that raises."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from shared.codec import as_text
from shared.job_scripts import LUA_FIELD, LUA_HERE
from shared.keys import FAIR_RING_SUFFIX, GROUP, HELD_SUFFIX, LUA_JOB_KEY, Keys
from shared.model_repository import ModelRepository
from shared.redis_client import executed

# Entries of a tenant's held list looked at for its oldest live job: a job cancelled while held
# keeps its entry until a refill drops it (the list's head is usually live: a refill drops the
# ended ones it meets).
HEADS_READ = 8

# KEYS[1]: a lane's stream; ARGV: the group's last delivered id, the job-key prefix. The
# submit stamp (`enq`, ms) of the oldest job still waiting: the first undelivered entry's (an
# entry a fair lane moved in was appended then, under a later id), and the oldest queued one at
# the head of each tenant's held list; none: false. O(tenants holding jobs). While the lane's
# slot migrates, a held job whose hash moved ahead counts as queued (a held entry is, but for a
# cancel the next refill drops), and a tenant whose list moved ahead is left out: the answer
# stands for the migration's seconds, where the script failed (a 503 on GET /v1/models, the
# gauges stale) until the slot had moved.
OLDEST = (
    LUA_JOB_KEY
    + f"""
local RING, HELD = '{FAIR_RING_SUFFIX}', '{HELD_SUFFIX}'
local HEADS = {HEADS_READ}
"""
    + """
local oldest = nil
"""
    + LUA_FIELD
    + LUA_HERE
    + """
local function older(fields)
  local ms = tonumber(field(fields, 'enq'))
  if ms and (not oldest or ms < oldest) then oldest = ms end
end
local function waiting(jid)
  local status, served = here('HGET', jobkey(ARGV[2], jid), 'status')
  return status == 'queued' or not served
end
local first = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', 1)[1]
if first then older(first[2]) end
for _, tenant in ipairs(here('LRANGE', KEYS[1] .. RING, 0, -1) or {}) do
  for _, packed in ipairs(here('LRANGE', KEYS[1] .. HELD .. tenant, 0, HEADS - 1) or {}) do
    local fields = cmsgpack.unpack(packed)
    local jid = field(fields, 'id')
    if jid and waiting(jid) then
      older(fields)
      break
    end
  end
end
return oldest and tostring(oldest) or false
"""
)


@dataclass(slots=True)
class LaneStats:
    """`length`: entries queued or in flight, jobs held back by fair queuing (`held`) included.
    `lag`: jobs no worker has been handed yet: the stream's (XLEN - pending, as every
    acknowledged entry is deleted; XINFO's own `lag` reads null once entries are acknowledged
    out of order, and was shown as 0 while work waited) and the held ones."""

    stream: str
    length: int = 0
    held: int = 0
    lag: int = 0
    pending: int = 0
    consumers: int = 0
    last_delivered: str = "0-0"
    oldest_age_s: float = 0.0


@dataclass(slots=True)
class PartitionStats:
    model: str
    variant: str
    online: LaneStats
    bulk: LaneStats
    dlq_depth: int = 0


async def read_partition_stats(
    client: aioredis.Redis, keys: Keys, repository: ModelRepository
) -> list[PartitionStats]:
    partitions = [
        PartitionStats(
            c.name, v, LaneStats(keys.queue(c.name, v)), LaneStats(keys.bulk_queue(c.name, v))
        )
        for c in repository
        for v in c.variants
    ]
    pipe = client.pipeline(transaction=False)
    for partition in partitions:
        for lane in (partition.online, partition.bulk):
            pipe.xinfo_groups(lane.stream)
            pipe.xlen(lane.stream)
            pipe.hget(keys.fair(lane.stream), "held")
        pipe.xlen(keys.dlq(partition.model, partition.variant))
    results = iter(await _replies(pipe))
    for partition in partitions:
        for lane in (partition.online, partition.bulk):
            _apply_group(lane, next(results))
            lane.length = _int(next(results))
            lane.held = _number(next(results))
            lane.lag = max(0, lane.length - lane.pending) + lane.held
            lane.length += lane.held
        partition.dlq_depth = _int(next(results))
    lanes = [lane for p in partitions for lane in (p.online, p.bulk)]
    await _oldest_ages(client, keys.job_prefix, lanes)
    return partitions


def _apply_group(lane: LaneStats, groups: Any) -> None:
    for group in groups if isinstance(groups, list) else []:
        if as_text(group.get("name")) == GROUP:
            lane.pending = int(group.get("pending", 0))
            lane.consumers = int(group.get("consumers", 0))
            lane.last_delivered = as_text(group.get("last-delivered-id", "0-0"))


async def _oldest_ages(client: aioredis.Redis, job_prefix: str, lanes: list[LaneStats]) -> None:
    """How long the oldest job still waiting in each lane has waited (`OLDEST`), for the lanes
    with any waiting, in one round trip (sent as EVAL, which a cluster pipeline routes by the
    lane without loading the script)."""
    busy = [lane for lane in lanes if lane.lag > 0]
    if not busy:
        return
    pipe = client.pipeline(transaction=False)
    for lane in busy:
        pipe.execute_command("EVAL", OLDEST, 1, lane.stream, lane.last_delivered, job_prefix)
    now_ms = time.time() * 1000
    for lane, oldest in zip(busy, await _replies(pipe), strict=True):
        if isinstance(oldest, bytes | str):
            lane.oldest_age_s = max(0.0, (now_ms - float(oldest)) / 1000)


async def _replies(pipe: Any) -> list[Any]:
    """The pipeline's replies, XINFO GROUPS's "no such key" (a lane not written yet) among them;
    any other error is raised, one that is no RedisError (a transport torn down under a
    command) as a lost connection."""
    replies = await executed(pipe, raise_on_error=False)
    for reply in replies:
        if isinstance(reply, RedisError):
            if not _no_such_key(reply):
                raise reply
        elif isinstance(reply, Exception):
            raise RedisConnectionError(f"connection lost mid-pipeline: {reply!r}") from reply
    return replies


def _no_such_key(error: RedisError) -> bool:
    return type(error) is ResponseError and str(error).startswith("no such key")


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _number(value: Any) -> int:
    """A counter read with HGET; none (a lane without fair queuing yet) reads as 0."""
    return int(value) if isinstance(value, bytes | str) else 0
