"""Two lanes per partition: online requests first, the bulk lane (batch pipelines) a share of
micro-batches while both have work (`bulk_share`), and all of them while online is idle — so a
large batch drains at full speed alone and interactive jobs still go first when they arrive."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from shared.keys import GROUP
from workers.partition.stream_reader import Delivery, StreamReader, take_first


class LaneScheduler:
    def __init__(self, online: StreamReader, bulk: StreamReader, bulk_share: float) -> None:
        self.online = online
        self.bulk = bulk
        self.bulk_share = bulk_share
        self.credit = 0.0

    async def next_batch(
        self, max_items: int, delay_ms: float, block_ms: int
    ) -> list[tuple[StreamReader, list[Delivery]]]:
        """One micro-batch (rarely two, when a blocking read returns from both lanes). Under
        load this is one round trip: the lane preferred now, else the other, in one script."""
        bulk_turn = self.credit >= 1.0
        order = [self.bulk, self.online] if bulk_turn else [self.online, self.bulk]
        reader, batch = await take_first(order, max_items)
        if reader is None:
            return await self._wait_either(max_items, delay_ms, block_ms)
        if reader is self.online:
            # the bulk lane was empty on its turn, or it was online's turn
            self.credit = 0.0 if bulk_turn else min(self.credit + self.bulk_share, 1.0)
        elif bulk_turn:
            self.credit -= 1.0
        return [(reader, await reader.gather(batch, max_items, delay_ms))]

    async def _wait_either(
        self, max_items: int, delay_ms: float, block_ms: int
    ) -> list[tuple[StreamReader, list[Delivery]]]:
        """Both lanes empty: one blocking read on both streams wakes on whichever fills first."""
        try:
            reply: Any = await self.online.redis.xreadgroup(
                GROUP,
                self.online.consumer,
                {self.online.stream: ">", self.bulk.stream: ">"},
                count=max_items,
                block=max(block_ms, 1),
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.online.ensure_group()
            await self.bulk.ensure_group()
            return []
        readers = {self.online.stream.encode(): self.online, self.bulk.stream.encode(): self.bulk}
        batches = []
        for stream, rows in reply or []:
            reader = readers[stream if isinstance(stream, bytes) else stream.encode()]
            claimed = await reader.claim(rows)
            batches.append((reader, await reader.gather(claimed, max_items, delay_ms)))
        return batches
