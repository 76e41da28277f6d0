"""Queue state of every partition and lane, read in two pipelined round trips however many
models there are (XINFO GROUPS + XLEN + the fair lane's held count, then the OLDEST script for
each lane with jobs waiting): what `GET /v1/models` shows and what the Prometheus gauges report.
A fair lane's flood waits outside its stream (held back per tenant), so its held jobs count as
waiting in `lag` and in the oldest age, or a lag alert stayed quiet while a backlog built.
A partition one of whose keys is of another type is left out (named once in the log). An error
reply other than those and a lane's "no such key" is raised, as one server's outage is: a cluster
pipeline returns each node's errors (a master failing over, loading, frozen) as its commands'
replies, which were read as 0 and dropped the gauges of that master's partitions to 0 mid-outage,
clearing their alerts, where the metrics route keeps the last values of a read that raises."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from shared.codec import as_text
from shared.job_scripts import LUA_FIELD, LUA_HERE
from shared.job_store import now_ms
from shared.keys import FAIR_SINCE_SUFFIX, GROUP, LUA_JOB_KEY, Keys
from shared.model_repository import ModelRepository
from shared.redis_client import executed

log = logging.getLogger(__name__)
# A partition's replies: each lane's XINFO GROUPS, XLEN and held count, then its DLQ's XLEN.
PER_PARTITION = 7
# Partitions left out for a key of another type, each named once a process, not at every read.
_LEFT_OUT: set[tuple[str, str]] = set()
# Held jobs looked at, oldest first, for the oldest still held: one that ended while held left
# the lane's set then, so the first is that one but for a job whose hash expired (never ended)
# or one a slot's migration left behind (see `unheld` in shared/job_scripts.py).
HEADS_READ = 8

# KEYS[1]: a lane's stream; ARGV: the group's last delivered id, the job-key prefix. The
# submit stamp (`enq`, ms) of the oldest job still waiting: the first undelivered entry's (an
# entry a fair lane moved in was appended then, under a later id), or the oldest held job's,
# from the lane's held jobs by submit time (`{lane}:fair:since`); none: false. O(log held): it
# read the head of every held tenant's list, thousands of reads inside Redis on every stats
# read with thousands of one-job tenants. While the lane's slot migrates, a held job whose hash
# moved ahead counts as held, and the set moved ahead reads as empty: the answer stands for the
# migration's seconds, where the script failed (a 503 on GET /v1/models, the gauges stale)
# until the slot had moved. A lane that held jobs before the set was kept counts those once
# they reach its stream.
OLDEST = (
    LUA_JOB_KEY
    + f"""
local SINCE = '{FAIR_SINCE_SUFFIX}'
local HEADS = {HEADS_READ}
"""
    + """
local oldest = nil
"""
    + LUA_FIELD
    + LUA_HERE
    + """
local function held(jid)
  local job, served = here('HMGET', jobkey(ARGV[2], jid), 'status', 'held')
  return not served or (job[1] == 'queued' and job[2] == '1')
end
local first = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', 1)[1]
if first then oldest = tonumber(field(first[2], 'enq')) end
local since = here('ZRANGE', KEYS[1] .. SINCE, 0, HEADS - 1, 'WITHSCORES') or {}
for i = 1, #since, 2 do
  if held(since[i]) then
    local ms = tonumber(since[i + 1])
    if not oldest or ms < oldest then oldest = ms end
    break
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
    replies = await _replies(pipe)
    read = [
        partition
        for n, partition in enumerate(partitions)
        if _applied(partition, replies[n * PER_PARTITION : (n + 1) * PER_PARTITION])
    ]
    lanes = [lane for p in read for lane in (p.online, p.bulk)]
    await _oldest_ages(client, keys.job_prefix, lanes)
    return read


async def read_dlq_depths(
    client: aioredis.Redis, keys: Keys, partitions: Sequence[tuple[str, str]]
) -> list[tuple[str, str, int]]:
    """(model, variant, dead letters) of each of `partitions` in one round trip: those that hold
    letters but that the repository no longer serves (`lettered_partitions`), which
    `read_partition_stats` does not read (their letters raised no `conveyor_dlq_depth`). One
    whose key holds another type is left out, as there."""
    if not partitions:
        return []
    pipe = client.pipeline(transaction=False)
    for model, variant in partitions:
        pipe.xlen(keys.dlq(model, variant))
    replies = await _replies(pipe)
    return [
        (model, variant, depth)
        for (model, variant), depth in zip(partitions, replies, strict=True)
        if isinstance(depth, int)
    ]


def _applied(partition: PartitionStats, replies: list[Any]) -> bool:
    """Whether `replies` (the partition's share of the read) are its state, applied; not when a
    key of it is of another type (an operator's slip), which is left out, named once: it
    refused the read of every partition, every pool's gauges gone (its alerts blind)."""
    if refused := next((r for r in replies if wrong_type(r)), None):
        if (partition.model, partition.variant) not in _LEFT_OUT:
            _LEFT_OUT.add((partition.model, partition.variant))
            log.warning(
                "%s:%s left out of the queue state: %s", partition.model, partition.variant, refused
            )
        return False
    results = iter(replies)
    for lane in (partition.online, partition.bulk):
        _apply_group(lane, next(results))
        lane.length = _int(next(results))
        lane.held = held_count(next(results))
        lane.lag = max(0, lane.length - lane.pending) + lane.held
        lane.length += lane.held
    partition.dlq_depth = _int(next(results))
    return True


def _apply_group(lane: LaneStats, groups: Any) -> None:
    for group in groups if isinstance(groups, list) else []:
        if as_text(group.get("name")) == GROUP:
            lane.pending = int(group.get("pending", 0))
            lane.consumers = int(group.get("consumers", 0))
            lane.last_delivered = as_text(group.get("last-delivered-id", "0-0"))


async def _oldest_ages(client: aioredis.Redis, job_prefix: str, lanes: list[LaneStats]) -> None:
    """How long the oldest job still waiting in each lane has waited (`OLDEST`), for the lanes
    with any waiting, in one round trip (sent as EVAL, which a cluster pipeline routes by the
    lane without loading the script). A stamp no clock gives (an infinity an operator wrote)
    reads as none: its infinite age was no JSON number (null on GET /v1/models)."""
    busy = [lane for lane in lanes if lane.lag > 0]
    if not busy:
        return
    pipe = client.pipeline(transaction=False)
    for lane in busy:
        pipe.execute_command("EVAL", OLDEST, 1, lane.stream, lane.last_delivered, job_prefix)
    now = now_ms()  # Redis's clock, which the producers stamp jobs by
    for lane, oldest in zip(busy, await _replies(pipe), strict=True):
        if isinstance(oldest, bytes | str) and math.isfinite(stamp := float(oldest)):
            lane.oldest_age_s = max(0.0, (now - stamp) / 1000)


async def _replies(pipe: Any) -> list[Any]:
    """The pipeline's replies, XINFO GROUPS's "no such key" (a lane not written yet) among them;
    any other error is raised, one that is no RedisError (a transport torn down under a
    command) as a lost connection."""
    replies = await executed(pipe, raise_on_error=False)
    for reply in replies:
        if isinstance(reply, RedisError):
            if not (_no_such_key(reply) or wrong_type(reply)):
                raise reply
        elif isinstance(reply, Exception):
            raise RedisConnectionError(f"connection lost mid-pipeline: {reply!r}") from reply
    return replies


# A WRONGTYPE refusal, as a command answers it, as a script that met it raises it, or as a
# blocking client's pipeline raises it (its command named first)
_WRONG_TYPE = re.compile(
    r"(Command # \d+ \(.*\) of pipeline caused error: )?(user_script:\d+: )?WRONGTYPE"
)


def _no_such_key(error: RedisError) -> bool:
    return type(error) is ResponseError and str(error).startswith("no such key")


def wrong_type(reply: Any) -> bool:
    """Whether a reply is a key's refusal for holding another type (an operator's slip), which
    leaves its partition out of a read of them all rather than failing the read; a script's
    (`OLDEST` reading a lane's held jobs) comes prefixed with the script's line, and one a
    blocking pipeline raised (the local autoscaler's backlog read) with its command."""
    return type(reply) is ResponseError and _WRONG_TYPE.match(str(reply)) is not None


def unless_wrong_type(refused: ResponseError) -> None:
    """Raises `refused` again unless it is a WRONGTYPE refusal, which its caller tolerates (an
    operator's slip keeps one key's reader from failing the whole read)."""
    if not wrong_type(refused):
        raise refused


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def held_count(value: Any) -> int:
    """A fair lane's `held` as HGET read it; none (a lane without fair queuing yet) reads as 0,
    and so does one below 0 (a count drifted, which the fair lane's scripts clamp as they next
    write it): added in, it hid as many queued jobs from the length, the lag and the backlog.
    One that is no integer (an operator's slip) reads as 0 too: it failed the read of every
    partition, a 500 on every model's card and the gauges gone."""
    try:
        return max(0, int(value)) if isinstance(value, bytes | str) else 0
    except ValueError:
        return 0
