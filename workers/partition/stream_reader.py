"""Reads one partition stream through the consumer group and claims each job in the same round
trip (Lua), so a micro-batch costs one read under load; blocks only when the stream is empty."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared import job_scripts
from shared.codec import RequestEntry, as_text
from shared.job_store import now_ms
from shared.keys import GROUP, Keys

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Delivery:
    """One entry handed to this consumer; `status` is the job's state after claiming it:
    `running` means run it, anything else means acknowledge and skip."""

    entry_id: bytes
    entry: RequestEntry | None
    status: str
    claimed_ms: int


class StreamReader:
    def __init__(self, client: aioredis.Redis, keys: Keys, stream: str, consumer: str) -> None:
        self.redis = client
        self.keys = keys
        self.stream = stream
        self.consumer = consumer
        self._take = client.register_script(job_scripts.TAKE)
        self._claim = client.register_script(job_scripts.CLAIM)

    async def ensure_group(self) -> None:
        """Create the group at id 0 so entries added before any worker existed are served."""
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def take(self, count: int) -> list[Delivery]:
        """Non-blocking read of up to `count` new entries, claimed atomically."""
        return (await take_first([self], count))[1]

    async def wait(self, count: int, block_ms: int) -> list[Delivery]:
        """Block up to `block_ms` for new entries, then claim what arrived."""
        reply = await self._guarded(
            self.redis.xreadgroup,
            GROUP,
            self.consumer,
            {self.stream: ">"},
            count=count,
            block=max(block_ms, 1),
        )
        if not reply:
            return []
        return await self.claim(reply[0][1])

    async def claim(self, rows: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Delivery]:
        """Claim entries that a plain XREADGROUP delivered (one Lua call for all of them)."""
        entries = [(eid, RequestEntry.decode(fields)) for eid, fields in rows]
        now = now_ms()
        statuses = await self._claim(
            args=[self.keys.job_prefix, now, self.consumer, *(e.job_id for _, e in entries)]
        )
        return [
            Delivery(eid, entry, as_text(status), now)
            for (eid, entry), status in zip(entries, statuses, strict=True)
        ]

    async def gather(
        self, batch: list[Delivery], max_items: int, delay_ms: float
    ) -> list[Delivery]:
        """Top a non-empty batch up from this stream until full or `delay_ms` has passed."""
        if not batch or delay_ms <= 0:
            return batch
        deadline = time.monotonic() + delay_ms / 1000.0
        while len(batch) < max_items:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            more = await self.take(max_items - len(batch)) or await self.wait(
                max_items - len(batch), remaining_ms
            )
            batch.extend(more)
        return batch

    async def _guarded(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """Recreate a vanished group (Redis restarted empty, or flushed) instead of dying."""
        try:
            return await call(*args, **kwargs)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group missing on %s; recreating", self.stream)
            await self.ensure_group()
            return None


async def take_first(
    readers: Sequence[StreamReader], count: int
) -> tuple[StreamReader | None, list[Delivery]]:
    """One round trip: up to `count` new entries of the first reader's stream that has any
    (the lanes of a partition, in the order the scheduler prefers), claimed atomically."""
    first = readers[0]
    now = now_ms()
    try:
        index, rows = await first._take(
            keys=[reader.stream for reader in readers],
            args=[GROUP, first.consumer, count, first.keys.job_prefix, now],
        )
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        log.warning("a consumer group is missing; recreating")
        for reader in readers:
            await reader.ensure_group()
        return None, []
    if not index:
        return None, []
    deliveries = [decode_delivery(eid, fields, status, now) for eid, fields, status in rows]
    return readers[index - 1], deliveries


def decode_delivery(entry_id: bytes, flat: list[bytes], status: bytes, now: int) -> Delivery:
    """A Lua script's `{id, fields, status}` row as a Delivery (undecodable: entry None)."""
    try:
        entry: RequestEntry | None = RequestEntry.decode(
            dict(zip(flat[::2], flat[1::2], strict=True))
        )
    except (KeyError, ValueError):
        log.error("undecodable entry %r on stream; acknowledging it", entry_id)
        entry = None
    return Delivery(entry_id, entry, as_text(status), now)
