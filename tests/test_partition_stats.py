"""What `read_partition_stats` reports of a lane (the console's overview, the metrics gauges,
`GET /v1/models`), on a real Valkey."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import read_partition_stats

KEYS = Keys("ps:")


async def test_lag_counts_the_undelivered_entries_after_out_of_order_acks(
    aredis: aioredis.Redis,
) -> None:
    """Jobs finish out of order (micro-batches side by side, reclaims), and every acknowledged
    entry is deleted: XINFO's `lag` then reads null, and the console and the lag gauge showed 0
    while entries waited. Lag is XLEN - pending: here 5 waiting, 1 in flight."""
    config = ModelConfig(name="m", kind="batch", backend="identity")
    stream = KEYS.queue("m", "default")
    await aredis.xgroup_create(stream, GROUP, "0", mkstream=True)
    _, second = [await aredis.xadd(stream, {"n": n}) for n in range(2)]
    await aredis.xreadgroup(GROUP, "c1", {stream: ">"})
    await aredis.xack(stream, GROUP, second)  # the later one ends first
    await aredis.xdel(stream, second)
    for n in range(5):
        await aredis.xadd(stream, {"n": n})
    [stats] = await read_partition_stats(aredis, KEYS, ModelRepository({"m": config}))
    groups = await aredis.xinfo_groups(stream)
    assert groups[0]["lag"] is None  # what the lag once shown was read from
    assert (stats.online.lag, stats.online.pending, stats.online.length) == (5, 1, 6)
