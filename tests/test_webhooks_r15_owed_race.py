"""Two workers' reclaimers racing over one lane's owed webhook events, on a real Valkey and the
real Celery broker queue there: each overdue event is handed over by one of them (both read the
same overdue ids and both sent them, every receiver getting each event twice), and one whose
reclaimer died before settling it is sent by the other once its lease lapses."""

from __future__ import annotations

import asyncio
import base64
import json

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, QueueLimits
from shared.webhook_outbox import WebhookOutbox
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer

KEYS = Keys("owed-race:")
CONFIG = ModelConfig(
    name="m", kind="batch", backend="identity", queue=QueueLimits(visibility_timeout_s=0.05)
)
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online
OWED = KEYS.webhooks_owed(STREAM)
HOOK = "http://127.0.0.1:9/hooks/jobs"


async def _ended(client: aioredis.Redis) -> str:
    """A job of the lane that ended `succeeded` with a webhook, owed since a second ago."""
    job_id = new_job_id("m", "v")
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    fields: dict[str, str | int] = {"model": "m", "variant": "v", "webhook": HOOK}
    await JobStore(client, KEYS, ttl_s=60).create(entry, STREAM, fields)
    await client.hset(KEYS.job(job_id), "status", "succeeded")
    await client.zadd(OWED, {job_id: now_ms() - 1_000})
    return job_id


async def _handed_over(client: aioredis.Redis) -> list[str]:
    """Ids of the events in the broker's queue (kombu's messages, their task kwargs)."""
    messages = await client.lrange("celery", 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in messages]
    return [kwargs["event"]["id"] for _, kwargs, _ in bodies]


async def test_two_reclaimers_racing_hand_each_owed_event_over_once(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    jobs = [await _ended(aredis) for _ in range(3)]
    first, second = (
        Reclaimer(aredis, KEYS, PARTITION, f"worker-{n}", 60, JobEvents(redis_url)) for n in (1, 2)
    )
    await asyncio.gather(first.resend_owed(STREAM), second.resend_owed(STREAM))
    assert sorted(await _handed_over(aredis)) == sorted(f"evt_{j}_succeeded" for j in jobs)
    assert await aredis.zcard(OWED) == 0


async def test_an_event_leased_by_a_reclaimer_that_died_is_taken_by_another_once_it_lapses(
    aredis: aioredis.Redis,
) -> None:
    job_id = await _ended(aredis)
    dead, live = WebhookOutbox(aredis, KEYS), WebhookOutbox(aredis, KEYS)
    assert await dead.overdue(STREAM, now_ms() - 50, 10) == [job_id]  # then it dies unsettled
    assert await live.overdue(STREAM, now_ms() - 50, 10) == []  # its lease holds
    assert await dead.overdue(STREAM, now_ms() - 50, 10) == [job_id]  # its own pass sends again
    await asyncio.sleep(0.1)  # past the lease: as long as the reclaimer waits for an overdue one
    assert await live.overdue(STREAM, now_ms() - 50, 10) == [job_id]
    await live.settle(STREAM, [job_id])
    assert await aredis.zcard(OWED) == 0
    assert await dead.overdue(STREAM, now_ms(), 10) == []
