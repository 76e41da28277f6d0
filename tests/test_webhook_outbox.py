"""A job's webhook event arrives at least once, under one stable id: the script that ends a job
with a webhook also puts it on its lane's owed set (FINISH, RECLAIM's dead letter, the API's
cancel), whoever hands the event to the Celery broker takes it off after, and the reclaimer's
pass re-sends what stayed owed past the visibility timeout (its worker died in between). On a
real Valkey; the events are read from the real Celery broker queue there, as kombu left them."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from kombu.exceptions import OperationalError

from producer_api.app import create_app
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, QueueLimits
from shared.settings import Settings
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("ob:")
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    queue=QueueLimits(visibility_timeout_s=0.05, max_deliveries=1),
)
PARTITION = Partition.of(KEYS, CONFIG, "v")
STREAM = PARTITION.online
OWED = KEYS.webhooks_owed(STREAM)
HOOK = "http://127.0.0.1:9/hooks/jobs"
WORKER = "box-1-1"
BROKER_QUEUE = "celery"  # Celery's default queue: a Redis list of kombu messages


async def _enqueue(client: aioredis.Redis, webhook: str = HOOK) -> str:
    """One queued job of the partition, with `webhook` (none: '') in its payload and hash, as
    the producer writes them."""
    job_id = new_job_id("m", "v")
    payload: dict[str, Any] = {"inputs": {"x": 1}, **({"webhook": webhook} if webhook else {})}
    fields: dict[str, str | int] = {"model": "m", "variant": "v"}
    if webhook:
        fields["webhook"] = webhook
    await JobStore(client, KEYS, ttl_s=60).create(
        RequestEntry(job_id, payload, now_ms()), STREAM, fields
    )
    return job_id


async def _read(client: aioredis.Redis, consumer: str = WORKER) -> list[Delivery]:
    reader = StreamReader(client, KEYS, PARTITION.streams, consumer)
    await reader.ensure_groups()
    return [d for _, got in await reader.wait([STREAM], 100, 100) for d in got]


async def _events(client: aioredis.Redis) -> list[dict[str, Any]]:
    """The events handed to delivery, oldest first: each kombu message's task kwargs."""
    messages = await client.lrange(BROKER_QUEUE, 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in reversed(messages)]
    return [kwargs["event"] for _, kwargs, _ in bodies]


@pytest.fixture
async def events(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[JobEvents]:
    """Job events on the real broker, whose first hand-over fails: what a worker killed between
    its write-back and the hand-over leaves (the result written, the event not sent)."""
    made = JobEvents(redis_url)
    send = made.dispatcher.send
    calls = Counter[str]()

    def dies_first(*args: Any) -> None:
        calls["send"] += 1
        if calls["send"] == 1:
            raise OperationalError("the worker died before the hand-over")
        send(*args)

    monkeypatch.setattr(made.dispatcher, "send", dies_first)
    yield made


async def _finish(client: aioredis.Redis, events: JobEvents) -> list[str]:
    """Run every queued job to success through a real write-back; the ids written."""
    writer = ResultWriter(client, KEYS, 60, events, WORKER)
    finishes = [
        PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": '{"y": 1}'})
        for d in await _read(client)
    ]
    written = await writer.finish(STREAM, finishes)
    await writer.close()
    return [item.job_id for item in written]


async def test_an_event_lost_after_the_write_back_is_sent_by_the_reclaimers_pass(
    aredis: aioredis.Redis, events: JobEvents
) -> None:
    job_id = await _enqueue(aredis)
    assert await _finish(aredis, events) == [job_id]
    assert await _events(aredis) == []  # the result is written, its event not handed over
    assert await aredis.hget(KEYS.job(job_id), "status") == b"succeeded"
    await asyncio.sleep(0.1)  # owed past the 50 ms visibility timeout: its worker is gone
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "rescuer-2-2", 60, events)
    assert await reclaimer.reclaim(STREAM) == []
    assert await reclaimer.reclaim(STREAM) == []  # sent once: no longer owed
    (event,) = await _events(aredis)
    assert (event["id"], event["type"]) == (f"evt_{job_id}_succeeded", "job.succeeded")
    assert event["data"]["id"] == job_id and event["data"]["outputs"] == {"y": 1}
    assert await aredis.zcard(OWED) == 0


async def test_a_job_without_a_webhook_costs_the_outbox_nothing(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    job_id = await _enqueue(aredis, webhook="")
    await aredis.config_resetstat()
    assert await _finish(aredis, JobEvents(redis_url)) == [job_id]
    stats: dict[str, Any] = await aredis.info("commandstats")
    assert not {"cmdstat_zadd", "cmdstat_zrem", "cmdstat_zrangebyscore"} & stats.keys()
    assert not await aredis.exists(OWED)
    assert await _events(aredis) == []


async def test_a_resent_event_keeps_its_id_and_a_sent_one_is_owed_no_more(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    job_id = await _enqueue(aredis)
    events = JobEvents(redis_url)
    assert await _finish(aredis, events) == [job_id]
    assert await aredis.zcard(OWED) == 0  # handed over, then taken off the set
    # a worker killed between its hand-over and taking the job off: the event is owed again
    await aredis.zadd(OWED, {job_id: now_ms() - 1_000})
    await Reclaimer(aredis, KEYS, PARTITION, "rescuer-3-3", 60, events).reclaim(STREAM)
    first, again = await _events(aredis)
    assert first["id"] == again["id"] == f"evt_{job_id}_succeeded"
    assert first["data"] == again["data"]
    assert await aredis.zcard(OWED) == 0


async def test_a_dead_letter_whose_event_is_lost_is_sent_by_the_next_pass(
    aredis: aioredis.Redis, events: JobEvents
) -> None:
    """RECLAIM's dead letter owes its job.failed event as FINISH owes a result's."""
    job_id = await _enqueue(aredis)
    assert len(await _read(aredis, "gone-4-4")) == 1  # a worker that died holding it
    await asyncio.sleep(0.1)
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "rescuer-5-5", 60, events)
    assert await reclaimer.reclaim(STREAM) == []  # dead-lettered; its hand-over failed
    assert await _events(aredis) == [] and await aredis.zcard(OWED) == 1
    await asyncio.sleep(0.1)
    await reclaimer.reclaim(STREAM)
    (event,) = await _events(aredis)
    assert (event["id"], event["data"]["status"]) == (f"evt_{job_id}_failed", "failed")
    assert await aredis.zcard(OWED) == 0


async def test_the_apis_cancel_owes_its_event_and_a_batch_withdrawal_does_not(
    aredis: aioredis.Redis,
) -> None:
    """TRANSITION owes the event of the cancel JobStore.transition makes (the API's, which
    hands it over); settle_many's ends (a batch's items) report none."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    cancelled, withdrawn = await _enqueue(aredis), await _enqueue(aredis)
    await store.transition(cancelled, JobStatus.CANCELLED)
    assert await store.settle_many([withdrawn], JobStatus.CANCELLED, {}) == 1
    assert [m.decode() for m in await aredis.zrange(OWED, 0, -1)] == [cancelled]


async def test_the_apis_cancel_hands_its_event_over_under_its_stable_id(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The producer, in-process on the real Valkey and broker: its cancel's event leaves the
    owed set once handed over."""
    settings = Settings(
        redis_url=redis_url,
        key_prefix="ob-api:",  # its own keys: no worker of another test reads its lane
        auth="disabled",
        webhook_secret="whsec-outbox",
        webhook_allowlist=["http://127.0.0.1:9/hooks/"],
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            body = {"model": "identity", "inputs": {}, "webhook": HOOK}
            created = await client.post("/v1/jobs", json=body)
            assert created.status_code == 202, created.text
            job_id = created.json()["id"]
            assert (await client.delete(f"/v1/jobs/{job_id}")).status_code == 200
    (event,) = await _events(aredis)
    assert (event["id"], event["type"]) == (f"evt_{job_id}_cancelled", "job.cancelled")
    stream = (await aredis.hget(Keys("ob-api:").job(job_id), "stream")).decode()
    assert await aredis.zcard(Keys("ob-api:").webhooks_owed(stream)) == 0
