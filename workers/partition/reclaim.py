"""Crash recovery for one partition: entries idle past the visibility timeout in any consumer's
pending list are taken over (XAUTOCLAIM) and run again, or dead-lettered after
`max_deliveries` (the job fails and its webhook is called); consumers that are gone and own
nothing are removed from the group."""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis

from shared import job_scripts
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from workers.partition.job_events import JobEvents
from workers.partition.stream_reader import Delivery, decode_delivery

log = logging.getLogger(__name__)
DEAD = ("dead", "dead-ended")  # dead-lettered by the script; "dead": the job failed just now


class Reclaimer:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        config: ModelConfig,
        variant: str,
        stream: str,
        consumer: str,
        ttl_s: int,
        webhooks: JobEvents,
    ) -> None:
        self.redis = client
        self.store = JobStore(client, keys, ttl_s)
        self.webhooks = webhooks
        self.keys = keys
        self.stream = stream
        self.dlq = keys.dlq(config.name, variant)
        self.consumer = consumer
        self.ttl_s = ttl_s
        self.idle_ms = int(config.queue.visibility_timeout_s * 1000)
        self.max_deliveries = config.queue.max_deliveries
        self.interval_s = max(0.25, config.queue.visibility_timeout_s / 2)
        self.batch = config.max_batch_size
        self._next = 0.0
        self._script = client.register_script(job_scripts.RECLAIM)

    def due(self) -> bool:
        return time.monotonic() >= self._next

    async def reclaim(self) -> list[Delivery]:
        """Claim a batch of abandoned entries; dead-lettered ones are already settled."""
        self._next = time.monotonic() + self.interval_s
        now = now_ms()
        rows = await self._script(
            keys=[self.stream, self.dlq],
            args=[
                GROUP,
                self.consumer,
                self.idle_ms,
                self.batch,
                self.keys.job_prefix,
                now,
                self.max_deliveries,
                self.ttl_s,
            ],
        )
        deliveries = [decode_delivery(eid, fields, status, now) for eid, fields, status in rows]
        dead = [d for d in deliveries if d.status in DEAD]
        for delivery in dead:
            log.error("dead-lettered entry %r of %s", delivery.entry_id, self.stream)
            if delivery.status == "dead" and delivery.entry is not None:
                await self._notify(delivery.entry.job_id)
        if deliveries:
            log.warning("reclaimed %d abandoned entries of %s", len(deliveries), self.stream)
        await self.prune_consumers()
        return [d for d in deliveries if d.status not in DEAD]

    async def _notify(self, job_id: str) -> None:
        """The failed job's webhook, with the view a client reading the job would get."""
        record = await self.store.get(job_id)
        if record is not None and (url := record.fields.get("webhook")):
            await self.webhooks.send(job_id, url, record.view())

    async def prune_consumers(self) -> list[str]:
        """Forget consumers idle past the visibility timeout that own no pending entries (live
        consumers re-read every block interval, so their idle time stays small)."""
        removed = []
        for info in await self.redis.xinfo_consumers(self.stream, GROUP):
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            if name != self.consumer and not info["pending"] and info["idle"] > self.idle_ms:
                await self.redis.xgroup_delconsumer(self.stream, GROUP, name)
                removed.append(name)
        return removed
