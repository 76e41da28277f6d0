"""The index of lettered partitions (`Keys.lettered`) as the producer's gauge refresh keeps it,
in-process on a real Valkey: a partition the repository no longer serves stayed indexed once its
letters were all purged or its dead-letter stream was gone, its `conveyor_dlq_depth` reading 0
for ever. It now leaves the index and the scrape; a served one stays indexed."""

from __future__ import annotations

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from producer_api.app import create_app
from producer_api.metrics import api_router
from shared.codec import as_text
from shared.dead_letters import delist_lettered, enlist_lettered
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_dlq_r23_unserved import _letter

KEYS = Keys("dlq-r23:")  # `_letter` writes under it
PURGED, GONE, OTHER = ("identity", "retired"), ("gone", "default"), ("gone", "other")
SERVED = ("identity", "default")


async def _depths(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """`conveyor_dlq_depth` by `model:variant`, read from Redis now."""
    monkeypatch.setattr(api_router, "_last_refresh", 0.0)
    text = (await client.get("/metrics")).text
    return {
        f"{sample.labels['model']}:{sample.labels['variant']}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "conveyor_dlq_depth"
    }


async def _indexed(aredis: aioredis.Redis) -> set[str]:
    return {as_text(name) for name in await aredis.smembers(KEYS.lettered)}


async def test_an_unserved_partition_without_letters_leaves_the_index_and_the_scrape(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
    purged = await _letter(aredis, *PURGED)
    await _letter(aredis, *GONE)
    await _letter(aredis, *OTHER)
    await enlist_lettered(aredis, KEYS, *SERVED)  # served, its letters all replayed: no stream
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        depths = await _depths(client, monkeypatch)
        assert [depths[name] for name in ("identity:retired", "gone:default")] == [1, 1], depths
        await aredis.xdel(KEYS.dlq(*PURGED), purged)  # its stream stays, empty
        await aredis.delete(KEYS.dlq(*GONE))  # its stream gone
        depths = await _depths(client, monkeypatch)
        assert "identity:retired" not in depths and "gone:default" not in depths, depths
        assert depths["gone:other"] == 1 and depths["identity:default"] == 0, depths
        assert await _indexed(aredis) == {"gone:other", "identity:default"}
        # emptied and delisted by another producer process: this one stops exporting it too
        await aredis.delete(KEYS.dlq(*OTHER))
        await delist_lettered(aredis, KEYS, [OTHER])
        assert "gone:other" not in await _depths(client, monkeypatch)
        # a letter dying there again enlists it again, and it is exported again
        await _letter(aredis, *PURGED)
        assert (await _depths(client, monkeypatch))["identity:retired"] == 1
    assert await _indexed(aredis) == {"identity:retired", "identity:default"}
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
