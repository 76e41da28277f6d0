"""Where a queued job stands, read in O(1) whatever the queue's length: its position in its lane
(the POSITION script: XPENDING summary, XLEN, GET of the lane's added counter, ZCOUNT of the
entries a cancel withdrew, one round trip),
and what a partition drains and with how many workers (per-second drained counters and worker
heartbeats), from which the producer estimates when the job will start (docs/architecture.md,
"Queue position and ETA"); and a dead worker's entries per lane, which count ahead of the jobs
queued behind them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text
from shared.keys import GROUP, Keys
from shared.redis_client import call_script
from shared.worker_registry import WorkerRegistry

# Seconds of drained counters a rate is measured over (and the part of this one gone by).
RATE_WINDOW_S = 5


class QueuePositions:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._position = client.register_script(job_scripts.POSITION)

    async def position(
        self, stream: str, seq: int | None, tenant: str, place: str | None = None
    ) -> int:
        """Entries still undelivered ahead of the job numbered `seq` in `stream`; for a job a
        fair lane holds (no `seq` yet; `place`, its `hseq`), those plus the held ones served
        before it."""
        args: list[str | int] = [GROUP, "" if seq is None else seq, tenant, place or ""]
        return int(await call_script(self._position, [stream, self.keys.added(stream)], args))


@dataclass(frozen=True, slots=True)
class PartitionLoad:
    """One partition's recent throughput per lane (entries finished per second over about the
    last RATE_WINDOW_S seconds) and its workers now, by heartbeat state, and their names (the
    consumers whose entries in flight are being run, not waiting to be reclaimed)."""

    online_per_s: float = 0.0
    bulk_per_s: float = 0.0
    serving: int = 0
    warming: int = 0
    workers: frozenset[str] = frozenset()


async def read_partition_loads(
    client: aioredis.Redis,
    keys: Keys,
    partitions: Sequence[tuple[str, str]],
    rates: Sequence[Sequence[float]],
) -> dict[tuple[str, str], PartitionLoad]:
    """Every partition's load: its lanes' drain `rates` (online, bulk: read with their backlog
    in one round trip, shared/drain_rate.py) and the worker registry's two round trips, however
    many partitions. A worker counts while it beats (a killed one drops out within the
    registry's TTL), unlike a consumer-group member, which stays until pruned."""
    beats = await WorkerRegistry(client, keys).live()
    loads = {}
    for (model, variant), (online_per_s, bulk_per_s) in zip(partitions, rates, strict=True):
        mine = [b for b in beats if f"{model}:{variant}" in b.models]
        loads[(model, variant)] = PartitionLoad(
            online_per_s,
            bulk_per_s,
            sum(1 for b in mine if b.state == "serving"),
            sum(1 for b in mine if b.state == "warming"),
            frozenset(b.name for b in mine),
        )
    return loads


async def read_abandoned(
    client: aioredis.Redis, lanes: Mapping[str, Collection[str]]
) -> dict[str, int]:
    """Entries each of `lanes` has in hand at consumers other than its live workers (the
    lane's value): a dead worker's, pending until the reclaimer hands them to a live one, which
    runs them before the lane's newer entries. One XPENDING summary per lane, one round trip; a
    lane with no group yet (or a key of another type) has none."""
    if not lanes:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for stream in lanes:
            pipe.xpending(stream, GROUP)
        replies = await pipe.execute(raise_on_error=False)
    return {
        stream: sum(
            holder["pending"]
            for holder in reply["consumers"]
            if as_text(holder["name"]) not in lanes[stream]
        )
        for stream, reply in zip(lanes, replies, strict=True)
        if not isinstance(reply, Exception)
    }
