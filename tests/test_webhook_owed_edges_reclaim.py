"""Edges of the reclaimer's settling of a lane's owed webhook events, on a real Valkey and the
real Celery broker queue there: an owed job with nothing to deliver (its hash names no webhook)
leaves the set on the pass that reads it, so it neither stays owed until the set's TTL nor
takes a place of the pass's bounded read from an event that is due; two workers' reclaimers
racing hand each overdue event over once (both read the same overdue ids and both sent them,
every receiver getting each event twice), and one whose reclaimer died before settling it is
sent by another once its lease lapses."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, QueueLimits
from shared.webhook_outbox import WebhookOutbox
from workers.partition import reclaim
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer

KEYS = Keys("owed-edges:")
CONFIG = ModelConfig(
    name="m", kind="batch", backend="identity", queue=QueueLimits(visibility_timeout_s=0.05)
)
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online
OWED = KEYS.webhooks_owed(STREAM)
HOOK = "http://127.0.0.1:9/hooks/jobs"


async def _ended(client: aioredis.Redis, webhook: str) -> str:
    """A job of the lane that ended `succeeded`, with `webhook` (none: '') on its hash."""
    job_id = new_job_id("m", "v")
    fields: dict[str, str | int] = {"model": "m", "variant": "v"}
    if webhook:
        fields["webhook"] = webhook
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    await JobStore(client, KEYS, ttl_s=60).create(entry, STREAM, fields)
    await client.hset(KEYS.job(job_id), "status", "succeeded")
    return job_id


async def _owed(client: aioredis.Redis) -> str:
    """A job of the lane that ended `succeeded` with a webhook, owed since a second ago."""
    job_id = await _ended(client, HOOK)
    await client.zadd(OWED, {job_id: now_ms() - 1_000})
    return job_id


async def _handed_over(client: aioredis.Redis) -> list[str]:
    """Ids of the events in the broker's queue (kombu's messages, their task kwargs)."""
    messages = await client.lrange("celery", 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in messages]
    return [kwargs["event"]["id"] for _, kwargs, _ in bodies]


async def test_an_owed_job_whose_hash_names_no_webhook_is_settled_at_once(
    aredis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left owed, it came back first on every pass until the set's TTL, which each new owed
    event renews: a pass's whole read of such jobs held every due event back for good."""
    monkeypatch.setattr(reclaim, "OWED_PER_PASS", 1)
    nothing, due = await _ended(aredis, ""), await _ended(aredis, HOOK)
    await aredis.zadd(OWED, {nothing: now_ms() - 2_000, due: now_ms() - 1_000})
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "rescuer-1-1", 60, JobEvents(redis_url))
    await reclaimer.resend_owed(STREAM)
    assert await _handed_over(aredis) == []  # nothing to deliver for the first
    assert await aredis.zrange(OWED, 0, -1) == [due.encode()]
    await reclaimer.resend_owed(STREAM)
    assert await _handed_over(aredis) == [f"evt_{due}_succeeded"]
    assert await aredis.zcard(OWED) == 0


async def test_an_owed_job_whose_hash_is_gone_is_settled_at_once(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    gone = new_job_id("m", "v")
    await aredis.zadd(OWED, {gone: now_ms() - 1_000})
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "rescuer-2-2", 60, JobEvents(redis_url))
    await reclaimer.resend_owed(STREAM)
    assert await aredis.zcard(OWED) == 0
    assert await _handed_over(aredis) == []


async def test_two_reclaimers_racing_hand_each_owed_event_over_once(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    jobs = [await _owed(aredis) for _ in range(3)]
    first, second = (
        Reclaimer(aredis, KEYS, PARTITION, f"worker-{n}", 60, JobEvents(redis_url)) for n in (1, 2)
    )
    await asyncio.gather(first.resend_owed(STREAM), second.resend_owed(STREAM))
    assert sorted(await _handed_over(aredis)) == sorted(f"evt_{j}_succeeded" for j in jobs)
    assert await aredis.zcard(OWED) == 0


async def test_an_event_leased_by_a_reclaimer_that_died_is_taken_by_another_once_it_lapses(
    aredis: aioredis.Redis,
) -> None:
    job_id = await _owed(aredis)
    dead, live = WebhookOutbox(aredis, KEYS), WebhookOutbox(aredis, KEYS)
    # a lease of 500 ms (as long as the reclaimer waits for an overdue one): the next two calls
    # fall within it on a loaded machine too (of 50 ms, a stall between them failed the test)
    assert await dead.overdue(STREAM, now_ms() - 500, 10) == [job_id]  # then it dies unsettled
    assert await live.overdue(STREAM, now_ms() - 500, 10) == []  # its lease holds
    assert await dead.overdue(STREAM, now_ms() - 500, 10) == [job_id]  # its own pass sends again
    await asyncio.sleep(0.6)  # past the lease
    assert await live.overdue(STREAM, now_ms() - 500, 10) == [job_id]
    await live.settle(STREAM, [job_id])
    assert await aredis.zcard(OWED) == 0
    assert await dead.overdue(STREAM, now_ms(), 10) == []
