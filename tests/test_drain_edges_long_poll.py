"""Once the producer is asked to stop, every long-poll round answers at once with the job as it
stands (producer_api/draining.py). A job-events stream of a job still running went on asking:
it read the job from Redis as fast as it could until its stream was cut."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.protocol import JobEvent
from producer_api.events.serving import EventsService
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("drain-edges-poll:")
QUEUED = {"model": "identity", "inputs": {"x": 1}}  # no worker here: it stays queued
MOST_READS = 20  # a read every REPLYLESS_POLL_S for half a second, with room to spare


async def test_an_events_stream_waits_for_its_job_at_a_pace_once_draining(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`aredis` flushed the database: the job is the only one queued."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    async with app_client(app) as client:
        accepted = await client.post("/v1/jobs", json=QUEUED)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        state = app.state.conveyor
        service = EventsService(state, ANONYMOUS)
        reads = 0
        read = service.jobs.get

        async def counted(*args: Any) -> dict[str, Any]:
            """The real long-poll round (Redis reads included), counted."""
            nonlocal reads
            reads += 1
            return await read(*args)

        monkeypatch.setattr(service.jobs, "get", counted)
        events = await service.open(job_id, None)
        assert events is not None
        state.draining.begin()
        streamed = asyncio.ensure_future(_final(events))
        await asyncio.sleep(0.5)
        await state.job_store.transition(job_id, JobStatus.CANCELLED)
        assert (await asyncio.wait_for(streamed, timeout=5))["status"] == "cancelled"
        assert reads <= MOST_READS


async def _final(events: AsyncIterator[JobEvent]) -> dict[str, Any]:
    """The final event's job view (a `queued` or `scaling` event may come first)."""
    async for event in events:
        if event.event == "final":
            return event.data
    raise AssertionError("the stream ended with no final event")
