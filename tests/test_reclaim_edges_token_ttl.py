"""On a real Valkey with a real consumer group, no engine: a generation whose worker crashed
past max_deliveries is dead-lettered by RECLAIM, which fails its job. Its token stream, written
until the crash, kept the result TTL (a day by default) where a finished job's stream gets the
short one (CONVEYOR_TOKEN_STREAM_TTL_S, 10 minutes by default): the failure now cuts it too."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.settings import get_settings
from tests.test_attempts import CONFIG  # reclaimed after 50 ms, twice at most
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("reclaim-tok:")
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online
RESULT_TTL_S = 86_400


async def _crashed_past_max_deliveries(client: aioredis.Redis, *job_ids: str) -> None:
    """Jobs read by a consumer that died on their last allowed delivery, idle past the
    visibility timeout."""
    store = JobStore(client, KEYS, ttl_s=RESULT_TTL_S)
    for job_id in job_ids:
        await store.create(RequestEntry(job_id, {"inputs": {}}, now_ms()), STREAM, {"model": "m"})
    reader = StreamReader(client, KEYS, PARTITION.streams, "dead-1")
    await reader.ensure_groups()
    ids = [d.entry_id for _, got in await reader.wait([STREAM], 10, 100) for d in got]
    await client.xclaim(STREAM, GROUP, "dead-1", 0, ids, retrycount=CONFIG.queue.max_deliveries)
    await asyncio.sleep(0.1)


async def test_a_dead_lettered_jobs_token_stream_gets_the_short_ttl(
    aredis: aioredis.Redis,
) -> None:
    await _crashed_past_max_deliveries(aredis, "streamed", "silent")
    tokens = KEYS.tokens("streamed")
    await aredis.xadd(tokens, {"e": "token"})  # as APPEND's first write: the result TTL
    await aredis.expire(tokens, RESULT_TTL_S)
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "c1-1", RESULT_TTL_S, JobEvents("redis://x"))

    assert await reclaimer.reclaim(STREAM, 10) == []  # both dead-lettered

    assert await aredis.hget(KEYS.job("streamed"), "status") == b"failed"
    assert 0 < await aredis.ttl(tokens) <= get_settings().token_stream_ttl_s
    assert not await aredis.exists(KEYS.tokens("silent"))  # none made for a job without one
