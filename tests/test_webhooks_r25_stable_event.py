"""A job's webhook event is the same event on every send: its `created` is when the job ended,
not when it was handed over, so the reclaimer's re-send of an event a dead worker left owed (a
visibility timeout or more later) is created when the job ended, as the first send was, under
the same `id`. It carried the re-send's own clock: one event id, two creation times. On a real
Valkey, the events read from the real Celery broker queue there."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.job_store import now_ms
from tests.test_webhook_outbox import (
    KEYS,
    OWED,
    PARTITION,
    STREAM,
    _enqueue,
    _events,
    _finish,
)
from workers.partition.job_events import JobEvents
from workers.partition.reclaim import Reclaimer

ENDED_AGO_MS = 300_000  # the job ended five minutes before the reclaimer's pass


async def test_a_resent_job_event_is_created_when_the_job_ended(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    job_id = await _enqueue(aredis)
    events = JobEvents(redis_url)
    assert await _finish(aredis, events) == [job_id]
    # the job ended five minutes ago, and its worker died after the hand-over, before it took
    # the job off the owed set: the reclaimer's pass sends the event again now
    ended_ms = now_ms() - ENDED_AGO_MS
    await aredis.hset(KEYS.job(job_id), "finished", ended_ms)
    await aredis.zadd(OWED, {job_id: ended_ms})
    await Reclaimer(aredis, KEYS, PARTITION, "rescuer-6-6", 60, events).reclaim(STREAM)
    first, again = await _events(aredis)
    assert first["id"] == again["id"] == f"evt_{job_id}_succeeded"
    for sent in (first, again):  # each send is created when the job it reports ended
        assert sent["created"] == int(sent["data"]["timings"]["finished"])
    assert again["created"] == ended_ms // 1000
