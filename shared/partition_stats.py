"""Queue state of every partition and lane, read in two pipelined round trips however many
models there are (XINFO GROUPS + XLEN + the fair lane's held count, then XRANGE after each
group's last delivered id): what `GET /v1/models` shows and what the Prometheus gauges report.
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

from shared.codec import as_text, stream_id
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.redis_client import executed


@dataclass(slots=True)
class LaneStats:
    """`length`: entries queued or in flight, jobs held back by fair queuing (`held`) included.
    `lag`: entries in the stream no worker has been handed yet (XLEN - pending, as every
    acknowledged entry is deleted): XINFO's own `lag` reads null once entries are acknowledged
    out of order, and was shown as 0 while work waited."""

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
            lane.lag = max(0, lane.length - lane.pending)
            lane.held = _number(next(results))
            lane.length += lane.held
        partition.dlq_depth = _int(next(results))
    await _oldest_ages(client, [lane for p in partitions for lane in (p.online, p.bulk)])
    return partitions


def _apply_group(lane: LaneStats, groups: Any) -> None:
    for group in groups if isinstance(groups, list) else []:
        if as_text(group.get("name")) == GROUP:
            lane.pending = int(group.get("pending", 0))
            lane.consumers = int(group.get("consumers", 0))
            lane.last_delivered = as_text(group.get("last-delivered-id", "0-0"))


async def _oldest_ages(client: aioredis.Redis, lanes: list[LaneStats]) -> None:
    """Age of the first entry after the group's last delivered id: the oldest still queued."""
    busy = [lane for lane in lanes if lane.length - lane.held > lane.pending]
    if not busy:
        return
    pipe = client.pipeline(transaction=False)
    for lane in busy:
        pipe.xrange(lane.stream, min=f"({lane.last_delivered}", count=1)
    now_ms = time.time() * 1000
    for lane, rows in zip(busy, await _replies(pipe), strict=True):
        if isinstance(rows, list) and rows:
            first_ms = stream_id(rows[0][0])[0]
            lane.oldest_age_s = max(0.0, (now_ms - first_ms) / 1000)


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
