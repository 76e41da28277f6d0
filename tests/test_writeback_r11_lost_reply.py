"""On a real Valkey, through a proxy that drops the reply to the first script call after the
server ran it (a connection torn at the worst time): the write-back retried as the loop retries
it writes each result once, counts one write and one attempt per job, and reports both jobs
written, so the loop's metrics count them once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis

from shared import job_scripts
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from tests.reply_dropper import ReplyDropper
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.redis_backoff import until_done
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("lost-reply:")
WORKER = "box-1-11"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
STREAM = PARTITION.online


@pytest.fixture
async def dropping(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """A client whose first script call's reply is lost after the server ran the script."""
    url = urlparse(redis_url)
    proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379)
    client = aioredis.Redis.from_url(await proxy.start())
    yield client
    await client.aclose()
    await proxy.stop()
    assert proxy.dropped == 1
    assert b"NOSCRIPT" not in proxy.answer  # the script ran: only its reply was lost


async def _read(client: aioredis.Redis, *job_ids: str) -> list[Finish]:
    """Jobs read by WORKER, each succeeded."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in job_ids:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, STREAM, {"model": "m", "variant": "v"})
    reader = StreamReader(client, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([STREAM], 10, 100)
    await reader.mark_running(deliveries)
    return [PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": '{"y": 1}'}) for d in deliveries]


async def test_a_write_back_whose_reply_was_lost_is_retried_and_writes_each_result_once(
    aredis: aioredis.Redis, dropping: aioredis.Redis
) -> None:
    await aredis.script_load(job_scripts.FINISH)  # its first call runs it
    finishes = await _read(aredis, "a", "b")
    writer = ResultWriter(dropping, KEYS, 60, JobEvents("redis://unused"), WORKER)

    written = await until_done(lambda: writer.finish(STREAM, finishes), asyncio.Event(), "t")
    await writer.close()

    assert sorted((f.job_id, f.status) for f in written) == [("a", "succeeded"), ("b", "succeeded")]
    for job_id in ("a", "b"):
        status, writes, history = await aredis.hmget(
            KEYS.job(job_id), "status", "writes", "attempt_history"
        )
        assert (status, writes) == (b"succeeded", b"1")
        assert [run["consumer"] for run in json.loads(history or "[]")] == [WORKER]
    assert (await aredis.xpending(STREAM, GROUP))["pending"] == 0
    assert await aredis.xlen(STREAM) == 0
