"""The index of lettered partitions (`Keys.lettered`) against its writer, on a real Valkey: a
letter dying between the gauge refresh's XLEN (0) and its SREM had its partition dropped from the
index (its SADD landed before the SREM), so `conveyor dlq partitions` and the console missed a
partition holding letters until the next letter died there. And members that name no partition
were skipped when read but kept for ever; one that is no UTF-8 failed every read of the index."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.dead_letters import delist_lettered, enlist_lettered, lettered_partitions
from shared.job_store import now_ms
from shared.partition_stats import read_dlq_depths
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_dlq_r26_unserved_index import KEYS, _depths, _indexed

GONE = ("gone", "default")  # a partition the repository does not serve
MALFORMED = [b"no-colon", b":variant", b"model:"]
NO_UTF8 = b"\xff\xfe:bytes"


async def _clean(aredis: aioredis.Redis) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)


async def _dies(aredis: aioredis.Redis, model: str, variant: str) -> None:
    """A letter dying as the reclaimer writes it: RECLAIM's XADD, then the index's SADD."""
    await aredis.xadd(KEYS.dlq(model, variant), {"reason": "crashed", "enqueued": now_ms()})
    await enlist_lettered(aredis, KEYS, model, variant)


async def test_a_letter_dying_between_the_depth_read_and_the_delist_keeps_its_partition(
    aredis: aioredis.Redis,
) -> None:
    """The refresh's steps with the writer's between its XLEN and its SREM: the partition is
    listed again, as it holds a letter; one still empty stays delisted."""
    await _clean(aredis)
    await enlist_lettered(aredis, KEYS, *GONE)  # its letters all purged since
    await enlist_lettered(aredis, KEYS, "gone", "empty")
    partitions = await lettered_partitions(aredis, KEYS)
    depths = await read_dlq_depths(aredis, KEYS, partitions)
    emptied = [(model, variant) for model, variant, depth in depths if not depth]
    assert emptied == [("gone", "default"), ("gone", "empty")]
    await _dies(aredis, *GONE)  # between the refresh's read and its SREM
    delisted = await delist_lettered(aredis, KEYS, emptied)
    assert await lettered_partitions(aredis, KEYS) == [GONE]
    assert delisted == [("gone", "empty")]  # the refresh stops exporting this one only
    await _clean(aredis)


async def test_the_refresh_removes_members_naming_no_partition(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipped when read, they were kept for ever; the refresh's SREM takes them too."""
    await _clean(aredis)
    await _dies(aredis, *GONE)
    await aredis.sadd(KEYS.lettered, *MALFORMED)
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        assert (await _depths(client, monkeypatch))["gone:default"] == 1
    assert await _indexed(aredis) == {"gone:default"}
    await _clean(aredis)


async def test_a_member_that_is_no_utf8_fails_no_read_of_the_index(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its UnicodeDecodeError failed `conveyor dlq partitions`, the console's dead-letter page
    and every scrape's gauge refresh."""
    await _clean(aredis)
    await _dies(aredis, *GONE)
    await aredis.sadd(KEYS.lettered, NO_UTF8)
    assert await lettered_partitions(aredis, KEYS) == [GONE]
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        page = await client.get("/console/dead-letters")
        assert page.status_code == 200, page.text
        assert (await _depths(client, monkeypatch))["gone:default"] == 1
    assert await aredis.smembers(KEYS.lettered) == {b"gone:default"}
    await _clean(aredis)
