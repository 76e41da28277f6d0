"""Batch API batches in Redis (not the workers' micro-batches): a hash per batch (metadata,
counters, webhook log), the item job ids in line order, the lines refused at submit, and one
"open" list per partition from which finished items are popped, so progress costs work
proportional to what changed, not to the batch's size."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from redis.typing import EncodableT

from shared import batch_api_scripts
from shared.batch_api_scripts import ITEM_STATES
from shared.codec import as_text, dumps, loads
from shared.job_store import now_ms
from shared.keys import Keys

CHUNK = 500


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in {self.COMPLETED, self.FAILED, self.CANCELLED, self.EXPIRED}


def _flat(fields: Mapping[str, str | int]) -> list[EncodableT]:
    return [part for pair in fields.items() for part in pair]


def _fields(flat: Sequence[str | bytes]) -> dict[str, str]:
    return {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}


@dataclass(slots=True)
class Refresh:
    """One look at a batch: its hash, the items still open, and the counts of finished items
    (those popped for good plus those seen finished in the window)."""

    fields: dict[str, str]
    open: int
    more: bool
    finalize: bool
    counts: dict[str, int]


@dataclass(slots=True)
class ItemState:
    job_id: str
    status: str | None
    custom_id: str | None
    line: int
    outputs: bytes | None
    error: bytes | None


class BatchApiStore:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._refresh = client.register_script(batch_api_scripts.REFRESH)
        self._request_end = client.register_script(batch_api_scripts.REQUEST_END)

    async def create(self, batch_id: str, fields: Mapping[str, str | int], ttl_s: int) -> None:
        key = self.keys.batch(batch_id)
        mapping = {**fields, "status": BatchStatus.VALIDATING.value, "created_at": now_ms()}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, items=_flat(mapping))
            pipe.expire(key, ttl_s)
            await pipe.execute()

    async def add_items(
        self, batch_id: str, items: Sequence[tuple[str, str]], rejected: Sequence[bytes]
    ) -> None:
        """Record enqueued items `(job_id, open list)` in line order and the refused lines, in
        one round trip."""
        by_list: dict[str, list[str]] = {}
        for job_id, open_list in items:
            by_list.setdefault(open_list, []).append(job_id)
        lists: list[tuple[str, Sequence[str | bytes]]] = [
            (self.keys.batch_items(batch_id), [job_id for job_id, _ in items]),
            *by_list.items(),
            (self.keys.batch_rejected(batch_id), rejected),
        ]
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, values in lists:
                for start in range(0, len(values), CHUNK * 4):
                    pipe.rpush(key, *values[start : start + CHUNK * 4])
            await pipe.execute()

    async def start(
        self,
        batch_id: str,
        open_lists: list[str],
        fields: Mapping[str, str | int],
        expires_ms: int,
    ) -> None:
        """validating → in_progress (or straight to failed when no line was valid)."""
        status = BatchStatus.IN_PROGRESS if open_lists else BatchStatus.FAILED
        mapping = {
            **fields,
            "status": status.value,
            f"{status.value}_at": now_ms(),
            "open_lists": dumps(open_lists).decode(),
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.batch(batch_id), items=_flat(mapping))
            if open_lists:
                pipe.zadd(self.keys.batches_active, {batch_id: expires_ms})
            await pipe.execute()

    async def read(self, batch_id: str) -> dict[str, str] | None:
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        return {as_text(k): as_text(v) for k, v in raw.items()} if raw else None

    async def refresh(
        self, batch_id: str, window: int, budget: int = 4 * CHUNK, stale_ms: int = 60_000
    ) -> Refresh | None:
        """Pop finished items and count them; None when the batch does not exist."""
        reply = await self._refresh(
            keys=[self.keys.batch(batch_id)],
            args=[self.keys.job_prefix, window, budget, now_ms(), stale_ms],
        )
        if not reply:
            return None
        open_items, more, finalize, flat, seen = reply
        fields = _fields(flat)
        counts = {
            state: int(fields.get(f"n_{state}", 0)) + int(extra)
            for state, extra in zip(ITEM_STATES, seen, strict=True)
        }
        return Refresh(fields, int(open_items), bool(more), bool(finalize), counts)

    async def request_end(
        self, batch_id: str, ending: BatchStatus
    ) -> tuple[str | None, BatchStatus | None]:
        """Ask a running batch to end as `ending`. Returns (status, ending in force): the
        ending is None when the batch is not running, and the first one asked when two race."""
        status, in_force = await self._request_end(
            keys=[self.keys.batch(batch_id)], args=[ending.value, now_ms()]
        )
        return (
            as_text(status) if status else None,
            BatchStatus(as_text(in_force)) if in_force else None,
        )

    async def open_ids(self, batch_id: str, open_lists: list[str]) -> list[str]:
        """Every job id still in an open list (what a cancel or an expiry must settle)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for open_list in open_lists:
                pipe.lrange(open_list, 0, -1)
            lists = await pipe.execute()
        return [as_text(job_id) for ids in lists for job_id in ids]

    async def items(self, batch_id: str) -> AsyncIterator[list[ItemState]]:
        """Items in line order, a chunk per round trip (one LRANGE plus pipelined HMGETs)."""
        key = self.keys.batch_items(batch_id)
        for start in range(0, await self.redis.llen(key), CHUNK):
            ids = [as_text(i) for i in await self.redis.lrange(key, start, start + CHUNK - 1)]
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(
                        self.keys.job(job_id), "status", "custom_id", "line", "outputs", "error"
                    )
                rows = await pipe.execute()
            yield [_item(job_id, row) for job_id, row in zip(ids, rows, strict=True)]

    async def rejected(self, batch_id: str) -> AsyncIterator[list[dict[str, object]]]:
        """Lines refused at submit, in line order, a chunk per round trip."""
        key = self.keys.batch_rejected(batch_id)
        for start in range(0, await self.redis.llen(key), CHUNK):
            yield [loads(line) for line in await self.redis.lrange(key, start, start + CHUNK - 1)]

    async def finish(self, batch_id: str, status: BatchStatus, open_lists: list[str]) -> None:
        """finalizing → `status`: every key of the batch, item job hashes included, now lives
        `ttl_s` from here, so early items' output does not expire before the batch's."""
        async for chunk in self.items(batch_id):
            async with self.redis.pipeline(transaction=False) as pipe:
                for item in chunk:
                    pipe.expire(self.keys.job(item.job_id), self.ttl_s)
                await pipe.execute()
        key = self.keys.batch(batch_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, items=["status", status.value, f"{status.value}_at", now_ms()])
            for name in (key, self.keys.batch_items(batch_id), self.keys.batch_rejected(batch_id)):
                pipe.expire(name, self.ttl_s)
            if open_lists:
                pipe.delete(*open_lists)
            pipe.zrem(self.keys.batches_active, batch_id)
            await pipe.execute()

    async def active(self) -> list[tuple[str, int]]:
        """Running batches with their expiry (ms)."""
        rows: list[Any] = await self.redis.zrange(self.keys.batches_active, 0, -1, withscores=True)
        return [(as_text(batch_id), int(score)) for batch_id, score in rows]

    async def set_fields(self, batch_id: str, fields: Mapping[str, str | int]) -> None:
        await self.redis.hset(self.keys.batch(batch_id), items=_flat(fields))


def _item(job_id: str, row: list[bytes | None]) -> ItemState:
    status, custom_id, line, outputs, error = row
    return ItemState(
        job_id=job_id,
        status=as_text(status) if status is not None else None,
        custom_id=as_text(custom_id) if custom_id is not None else None,
        line=int(line) if line is not None else 0,
        outputs=outputs,
        error=error,
    )
