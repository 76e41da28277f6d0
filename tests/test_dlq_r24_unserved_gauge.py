"""`conveyor_dlq_depth` of a partition the repository no longer serves, in-process on a real
Valkey: only served partitions were read, so a removed variant's letters raised no gauge (and no
alert). The partitions indexed as holding letters are read too; `GET /v1/models` still lists
the served models only."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from producer_api.app import create_app
from producer_api.metrics import api_router
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_dlq_r23_unserved import _letter

KEYS = Keys("dlq-r23:")  # `_letter` writes under it


async def test_the_gauge_counts_letters_of_a_partition_no_longer_served(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
    for _ in range(2):
        await _letter(aredis, "identity", "retired")
    monkeypatch.setattr(api_router, "_last_refresh", 0.0)  # read now, whatever scraped before
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        text = (await client.get("/metrics")).text
        listed = await client.get("/v1/models")
    depths = {
        (sample.labels["model"], sample.labels["variant"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "conveyor_dlq_depth"
    }
    assert depths[("identity", "retired")] == 2, depths
    cards = {card["id"]: card for card in listed.json()["data"]}
    assert "retired" not in [p["variant"] for p in cards["identity"]["partitions"]]
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
