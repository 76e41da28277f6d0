"""Where a queued job stands, read in O(1) whatever the queue's length: its position in its lane
(the POSITION script: XPENDING summary, XLEN, GET of the lane's added counter, ZCOUNT of the
entries a cancel withdrew, one round trip),
and what a partition drains and with how many workers (per-second drained counters and worker
heartbeats), from which the producer estimates when the job will start (docs/architecture.md,
"Queue position and ETA"); and a dead worker's entries per lane, of jobs not ended, which
count ahead of the jobs queued behind them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text
from shared.job_states import TERMINAL
from shared.keys import GROUP, Keys
from shared.redis_client import call_script
from shared.worker_registry import WorkerRegistry

# Seconds of drained counters a rate is measured over (and the part of this one gone by).
RATE_WINDOW_S = 5
# A stream entry's id, or a field's name or value, as the client returns it.
EntryId = bytes | str
# What an entry that names no job (or is gone) is known by among AbandonedEntries' job ids.
NO_JOB = ""


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


class AbandonedEntries:
    """Entries each lane has in hand at consumers other than its live workers, of jobs that may
    still run: a dead worker's, pending until the reclaimer hands them to a live one, which runs
    them before the lane's newer entries. A cancelled (or otherwise ended) job's entry stays
    pending at its consumer too, but the reclaimer only acknowledges it: counted, it put every
    later job one further back than it stood. The job id of each entry read is kept (a dead
    consumer's entries change only as the reclaimer takes them), so each entry's fields, its
    payload, are read once, not on every refresh."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        # (lane, entry) → its job id (None: not read yet; NO_JOB: read, naming none)
        self._jobs: dict[tuple[str, EntryId], str | None] = {}

    async def read(self, lanes: Mapping[str, Collection[str]]) -> dict[str, int]:
        """Each of `lanes`' entries held by consumers not among its live workers (the lane's
        value), less those of ended jobs. One XPENDING summary per lane, one round trip; only
        while such a consumer holds entries, two more: their ids, then their jobs' statuses
        (and the fields of entries not seen before, whose jobs count as running until the next
        read). A lane with no group yet (or a key of another type) has none."""
        if not lanes:
            self._jobs.clear()
            return {}
        dead = await self._dead_holders(lanes)
        held = await self._held_ids(dead)
        self._jobs = {entry: self._jobs.get(entry) for entry in held}
        return await self._runnable(dead, held)

    async def _dead_holders(
        self, lanes: Mapping[str, Collection[str]]
    ) -> dict[str, dict[str, int]]:
        """Per lane, its consumers not among its live workers that hold entries, with how many."""
        async with self.client.pipeline(transaction=False) as pipe:
            for stream in lanes:
                pipe.xpending(stream, GROUP)
            replies = await pipe.execute(raise_on_error=False)
        return {
            stream: {
                name: holder["pending"]
                for holder in reply["consumers"]
                if (name := as_text(holder["name"])) not in lanes[stream]
            }
            for stream, reply in zip(lanes, replies, strict=True)
            if not isinstance(reply, Exception)
        }

    async def _held_ids(self, dead: Mapping[str, Mapping[str, int]]) -> list[tuple[str, EntryId]]:
        """The (lane, entry id) of every entry the `dead` consumers hold (none read: no call)."""
        calls = [(stream, name, count) for stream, by in dead.items() for name, count in by.items()]
        if not calls:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for stream, name, count in calls:
                pipe.xpending_range(stream, GROUP, "-", "+", count, consumername=name)
            replies = await pipe.execute(raise_on_error=False)
        return [
            (stream, row["message_id"])
            for (stream, _, _), rows in zip(calls, replies, strict=True)
            if not isinstance(rows, Exception)
            for row in rows
        ]

    async def _runnable(
        self, dead: Mapping[str, Mapping[str, int]], held: list[tuple[str, EntryId]]
    ) -> dict[str, int]:
        """The dead consumers' entries per lane less those whose job is known to have ended,
        in one round trip: the statuses of the jobs known, the fields of entries not yet seen
        (an entry not read, or with no job, counts as one that runs)."""
        counts = {stream: sum(holders.values()) for stream, holders in dead.items()}
        asked = [key for key in held if self._jobs[key] != NO_JOB]
        if not asked:
            return counts
        async with self.client.pipeline(transaction=False) as pipe:
            for stream, entry in asked:
                job_id = self._jobs[(stream, entry)]
                if job_id is None:
                    pipe.xrange(stream, entry, entry, count=1)
                else:
                    pipe.hget(self.keys.job(job_id), "status")
            replies = await pipe.execute(raise_on_error=False)
        for key, reply in zip(asked, replies, strict=True):
            if isinstance(reply, Exception):
                continue
            if self._jobs[key] is None:
                self._jobs[key] = _job_of(reply)
            elif isinstance(reply, bytes | str) and as_text(reply) in TERMINAL:
                counts[key[0]] -= 1
        return counts


def _job_of(rows: Sequence[tuple[EntryId, Mapping[EntryId, EntryId]]]) -> str:
    """The job id an XRANGE reply's entry names (NO_JOB: no entry, or one that names none)."""
    for _, fields in rows:
        for name, value in fields.items():
            if as_text(name) == "id":
                return as_text(value)
    return NO_JOB
