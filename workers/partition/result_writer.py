"""Write-back for a whole micro-batch in one round trip: results, replies (one PUBLISH per
waiting producer, carrying all its jobs), XACK and XDEL happen in one Lua script, so a result is
visible if and only if its entry is acknowledged."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import as_text
from shared.keys import GROUP, Keys
from shared.variant_stats import VariantStats
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents


class ResultWriter:
    def __init__(
        self, client: aioredis.Redis, keys: Keys, ttl_s: int, events: JobEvents, worker: str
    ) -> None:
        self.keys = keys
        self.ttl_s = ttl_s
        self.worker = worker
        self.events = events
        self._finish = client.register_script(job_scripts.FINISH)
        self.stats = VariantStats(client, keys)

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        """Write and acknowledge the batch, then hand the webhook events of the written ones to
        delivery (only then, so a redelivered job does not notify twice); returns the finishes
        whose results were written (the rest were acknowledged only: already terminal,
        cancelled, or gone)."""
        written = await self._write(stream, batch)
        await self.stats.record_finished(
            {**i.context, **i.fields, "status": i.status} for i in written
        )
        await self.events.notify(written)
        return written

    async def _write(self, stream: str, batch: list[Finish]) -> list[Finish]:
        if not batch:
            return []
        args: list[str | bytes | int] = [GROUP, self.ttl_s, self.keys.job_prefix, self.worker]
        drained = self.keys.drained(stream, int(time.time()))
        for item in batch:
            args += [item.entry_id, item.job_id, item.reply, item.message(), item.status]
            args.append(len(item.fields))
            for name, value in item.fields.items():
                args += [name, value]
        written = {
            as_text(job_id) for job_id in await self._finish(keys=[stream, drained], args=args)
        }
        return [item for item in batch if item.job_id in written]
