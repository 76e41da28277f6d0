"""Crash recovery for one partition: entries idle past the visibility timeout in any consumer's
pending list are taken over (XCLAIM, by RECLAIM) and run again, or dead-lettered after
`max_deliveries` (the job fails, counts as a failed job in `conveyor_jobs_finished_total` and
as its variant's error for canaries and experiments, and its webhook is called); consumers that
are gone and own nothing are removed from the group. Each pass also re-sends the webhook events
a lane has owed longer than the visibility timeout: their worker died after the step that ended
the job and before it handed the event over (shared/job_scripts.py, `owe`)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Collection

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text
from shared.consumer_groups import DELETE_IF_IDLE, recreating_groups
from shared.dead_letters import enlist_lettered
from shared.job_states import JobStatus
from shared.job_store import JobRecord, JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.metrics import JOBS_FINISHED
from shared.rate_limit import queue_slot_frees
from shared.redis_client import call_script, sent_once
from shared.token_stream import ended_stream_ttl_s
from shared.variant_stats import VariantStats
from shared.webhook_outbox import WebhookOutbox
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.redis_backoff import OUTAGE
from workers.partition.stream_reader import Delivery, LaneEntry, MicroBatch, decode_delivery

log = logging.getLogger(__name__)
DEAD = ("dead", "dead-ended")  # dead-lettered by the script; "dead": the job failed just now
OWED_PER_PASS = 100  # owed events a pass re-sends at most; a longer backlog takes more passes


class Reclaimer:
    """Reclaims both lane streams of one partition, online first, each at most every half
    visibility timeout."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        partition: Partition,
        consumer: str,
        ttl_s: int,
        events: JobEvents,
    ) -> None:
        queue = partition.config.queue
        self.redis = client
        self.store = JobStore(client, keys, ttl_s)
        self.events = events
        self.outbox = WebhookOutbox(client, keys)
        self.keys = keys
        self.streams = partition.streams
        self.dlq = keys.dlq(partition.config.name, partition.variant)
        self.variant = partition.labels  # (model, variant)
        self.stats = VariantStats(client, keys)
        self.consumer = consumer
        self.ttl_s = ttl_s
        # a dead-lettered job's token stream ends as a finished one's
        self.token_prefix = keys.token_prefix
        self.token_ttl_s = ended_stream_ttl_s(ttl_s)
        self.idle_ms = int(queue.visibility_timeout_s * 1000)
        self.max_deliveries = queue.max_deliveries
        self.interval_s = max(0.25, queue.visibility_timeout_s / 2)
        self.batch = partition.max_batch_size
        self._next = dict.fromkeys(self.streams, 0.0)
        self._kept = dict.fromkeys(self.streams, 0.0)  # when `housekeep` is next due, per lane
        self._script = client.register_script(job_scripts.RECLAIM)
        self._delete_if_idle = client.register_script(DELETE_IF_IDLE)

    async def due(
        self, count: int, in_hand: Collection[LaneEntry] = frozenset()
    ) -> MicroBatch | None:
        """Up to `count` of the first lane's abandoned entries whose reclaim is due:
        (stream, deliveries). A lane stays due while its claims come back full, past any
        dead-lettered ones and any `in_hand`, so a backlog drains at once however few are
        claimed at a time."""
        for stream in self.streams:
            while time.monotonic() >= self._next[stream]:
                if abandoned := await self.reclaim(stream, count, in_hand):
                    return stream, abandoned
        return None

    async def housekeep(self) -> None:
        """What a reclaim pass does besides claiming (owed webhook events re-sent, idle consumers
        pruned), on the same interval, for a loop that claims nothing meanwhile: it runs a
        reclaimed entry first, one at a time, and a reclaimed generation runs for minutes."""
        for stream in self.streams:
            if time.monotonic() < self._kept[stream]:
                continue
            self._kept[stream] = time.monotonic() + self.interval_s
            try:
                await self.resend_owed(stream)
                # a lane that vanished (NOGROUP) gets its groups again, as a reclaim's does
                prune = functools.partial(self.prune_consumers, stream)
                await recreating_groups(self.redis, self.streams, prune)
            except OUTAGE as exc:
                log.warning("housekeeping of %s waits for Redis: %r", stream, exc)

    async def reclaim(
        self, stream: str, count: int | None = None, in_hand: Collection[LaneEntry] = frozenset()
    ) -> list[Delivery]:
        """Claim abandoned entries (at most `count`, or a micro-batch's worth); dead-lettered
        ones are already settled. The lane's next reclaim is due half a visibility timeout
        later, or at once when this one claimed all it asked for (more may be waiting). Those
        `in_hand` are left to run (RECLAIM): this consumer's own, still running, went idle past
        the timeout while an outage failed their touches; taken over, they ran twice on this
        worker (FINISH tells a run taken over only by another worker's name), each with an
        attempt `crashed` by itself, and one at max_deliveries was dead-lettered as it ran."""
        self._next[stream] = self._kept[stream] = time.monotonic() + self.interval_s
        now = now_ms()
        asked = min(self.batch, count or self.batch)
        args: list[str | int | bytes] = [
            GROUP,
            self.consumer,
            self.idle_ms,
            asked,
            self.keys.job_prefix,
            now,
            self.max_deliveries,
            self.ttl_s,
            self.token_prefix,
            self.token_ttl_s,
            *(entry_id for lane, entry_id in in_hand if lane == stream),
        ]
        with sent_once():  # sent again, it claims past what the lost reply held (`held`)
            rows = await recreating_groups(
                self.redis, self.streams, lambda: self._script(keys=[stream, self.dlq], args=args)
            )
        if rows is None:  # the lane had vanished: nothing of it to reclaim
            return []
        if len(rows) >= asked:
            self._next[stream] = 0.0
        deliveries = [
            decode_delivery(eid, fields, status, now, redelivered=True, attempts=int(count))
            for eid, fields, status, count in rows
        ]
        dead = [d for d in deliveries if d.status in DEAD]
        for delivery in dead:
            log.error("dead-lettered entry %r of %s", delivery.entry_id, stream)
        if deliveries:
            log.warning("reclaimed %d abandoned entries of %s", len(deliveries), stream)
        try:
            await self._settle(stream, [d for d in dead if d.status == "dead"], bool(dead))
        except OUTAGE as exc:
            log.warning("reclaim of %s committed; the rest waits for Redis: %r", stream, exc)
        return [d for d in deliveries if d.status not in DEAD]

    async def _settle(self, stream: str, dead: list[Delivery], lettered: bool) -> None:
        """What follows a RECLAIM that committed (`lettered`: it dead-lettered entries). An
        outage here costs at most what it does (slots the in-flight scan frees later, events the
        next run sends, as owed, a prune the next run does, a partition the console lists once
        it is served or letters die again), not the claimed entries: raised, they come back
        through `held` as the redeliveries they are (a `restart` for a generation's stream,
        attempts as delivered)."""
        if dead:  # before any await: an outage below must not lose the count
            JOBS_FINISHED.labels(*self.variant, JobStatus.FAILED).inc(len(dead))
        if lettered:
            await enlist_lettered(self.redis, self.keys, *self.variant)
        await self._free_slots(dead)
        if dead:  # a variant that crashes its workers fails: no canary may read it as healthy
            await self.stats.add_counts(*self.variant, {"requests": len(dead), "errors": len(dead)})
        await self._notify(stream, [d.entry.job_id for d in dead if d.entry is not None])
        await self.resend_owed(stream)
        await self.prune_consumers(stream)

    async def _free_slots(self, failed: list[Delivery]) -> None:
        """Dead-lettered jobs give back their API keys' in-flight slots (in the keys' slots,
        so not inside RECLAIM)."""
        held = [(d.entry.inflight, d.entry.job_id) for d in failed if d.entry and d.entry.inflight]
        if held:
            async with self.redis.pipeline(transaction=False) as pipe:
                queue_slot_frees(pipe, held)
                await pipe.execute()

    async def resend_owed(self, stream: str) -> None:
        """Hand over again the events the lane has owed longer than the visibility timeout (a
        live worker hands its over at once), at most OWED_PER_PASS."""
        owed = await self.outbox.overdue(stream, now_ms() - self.idle_ms, OWED_PER_PASS)
        await self._notify(stream, owed)

    async def _notify(self, stream: str, job_ids: list[str]) -> None:
        """The ended jobs' webhook events, each with the view a client reading the job would
        get, then one ZREM of those handed over from the lane's owed set, and of those with no
        event to send (hash gone, or naming no webhook)."""
        if not job_ids:
            return
        records = await self.store.get_many(job_ids)
        pairs = zip(job_ids, records, strict=True)
        settled = [job_id for job_id, record in pairs if await self._settled(job_id, record)]
        await self.outbox.settle(stream, settled)

    async def _settled(self, job_id: str, record: JobRecord | None) -> bool:
        """Whether the job owes no event now: handed over just now, or there is none to send
        (its hash is gone, or names no webhook). Left owed, one with none came back first on
        every pass until the set's TTL, which each event owed renews: a pass's whole read of
        such jobs held every due event back for good."""
        if record is None or not (url := record.fields.get("webhook")):
            return True
        tenant = record.fields.get("tenant", "default")
        return await self.events.send(job_id, url, record.view(), tenant)

    async def prune_consumers(self, stream: str) -> list[str]:
        """Forget consumers idle past the visibility timeout that own no pending entries (live
        consumers re-read every block interval, so their idle time stays small); each deleted
        only if it still owns none (`DELETE_IF_IDLE`)."""
        idle = [
            as_text(info["name"])
            for info in await self.redis.xinfo_consumers(stream, GROUP)
            if not info["pending"] and info["idle"] > self.idle_ms
        ]
        return [
            name
            for name in idle
            if name != self.consumer
            and await call_script(self._delete_if_idle, [stream], [GROUP, name])
        ]
