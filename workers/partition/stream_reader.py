"""The one owner of a partition's consumer-group reads: reading both lane streams through the
group and claiming each job in the same round trip (Lua), so a micro-batch costs one read under
load; a blocking XREADGROUP only when both are empty; the XCLAIM that keeps long-running entries
ours; and the recovery of a consumer group that vanished (Redis restarted empty, or flushed)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared import job_scripts
from shared.codec import RequestEntry, as_text
from shared.consumer_groups import ensure_groups
from shared.job_store import now_ms
from shared.keys import GROUP, Keys

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Delivery:
    """One entry handed to this consumer; `status` is the job's state after claiming it:
    `running` means run it, anything else means acknowledge and skip. `redelivered`: taken over
    from a consumer that abandoned it (a previous attempt may have streamed tokens)."""

    entry_id: bytes
    entry: RequestEntry | None
    status: str
    claimed_ms: int
    redelivered: bool = False


Batch = tuple[str, list[Delivery]]  # (stream, deliveries read from it)


class StreamReader:
    def __init__(
        self, client: aioredis.Redis, keys: Keys, streams: Sequence[str], consumer: str
    ) -> None:
        self.redis = client
        self.keys = keys
        self.streams = tuple(streams)
        self.consumer = consumer
        self._take = client.register_script(job_scripts.TAKE)
        self._claim = client.register_script(job_scripts.CLAIM)

    async def ensure_groups(self) -> None:
        """Create the lanes' groups where missing (`shared/consumer_groups.py`)."""
        await ensure_groups(self.redis, self.streams)

    async def take(self, streams: Sequence[str], count: int) -> Batch | None:
        """One non-blocking round trip: up to `count` new entries of the first of `streams`
        that has any (in the order the caller prefers), claimed atomically."""
        now = now_ms()
        reply = await self._recovering(
            lambda: self._take(
                keys=list(streams), args=[GROUP, self.consumer, count, self.keys.job_prefix, now]
            )
        )
        if not reply or not reply[0]:
            return None
        index, rows = reply
        return streams[index - 1], [decode_delivery(eid, f, status, now) for eid, f, status in rows]

    async def wait(self, streams: Sequence[str], count: int, block_ms: int) -> list[Batch]:
        """Block up to `block_ms` on all of `streams` at once (wakes on whichever fills first),
        then claim what arrived."""
        reply: Any = await self._recovering(
            lambda: self.redis.xreadgroup(
                GROUP,
                self.consumer,
                dict.fromkeys(streams, ">"),
                count=count,
                block=max(block_ms, 1),
            )
        )
        return [(as_text(stream), await self._claim_rows(rows)) for stream, rows in reply or []]

    async def gather(
        self, batch: Batch, max_items: int, delay_ms: float, preferred: Sequence[int] = ()
    ) -> Batch:
        """Top a non-empty batch up from its own stream until full or `delay_ms` has passed;
        when the stream runs dry at one of the `preferred` sizes (a size that fills an engine's
        shape bucket, as Triton's `preferred_batch_size`), stop there instead of waiting."""
        stream, deliveries = batch
        if not deliveries or delay_ms <= 0:
            return batch
        deadline = time.monotonic() + delay_ms / 1000.0
        while len(deliveries) < max_items:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            wanted = max_items - len(deliveries)
            more = await self.take([stream], wanted)
            if more is None and len(deliveries) in preferred:
                break
            more = more or next(iter(await self.wait([stream], wanted, remaining_ms)), None)
            if more is not None:
                deliveries.extend(more[1])
        return batch

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> None:
        """XCLAIM (JUSTID: the delivery count stays) entries this consumer is still running, so
        their idle time resets and no reclaimer mistakes them for abandoned ones."""
        await self._recovering(
            lambda: self.redis.xclaim(stream, GROUP, self.consumer, 0, list(entry_ids), justid=True)
        )

    async def _claim_rows(self, rows: list[tuple[bytes, dict[bytes, bytes]]]) -> list[Delivery]:
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

    async def _recovering(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """Recreate vanished groups (NOGROUP) instead of dying; the call then returns None."""
        try:
            return await call()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group missing on %s; recreating", ", ".join(self.streams))
            await self.ensure_groups()
            return None


def decode_delivery(
    entry_id: bytes, flat: list[bytes], status: bytes, now: int, redelivered: bool = False
) -> Delivery:
    """A Lua script's `{id, fields, status}` row as a Delivery (undecodable: entry None)."""
    try:
        entry: RequestEntry | None = RequestEntry.decode(
            dict(zip(flat[::2], flat[1::2], strict=True))
        )
    except (KeyError, ValueError):
        log.error("undecodable entry %r on stream; acknowledging it", entry_id)
        entry = None
    return Delivery(entry_id, entry, as_text(status), now, redelivered)
