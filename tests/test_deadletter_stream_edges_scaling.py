"""The standing events (`queued`, `scaling`) of a queued job's event stream, on a real Valkey with
the producer in-process and no worker. The partitions' loads are set by the test, the producer's
refresh of them stopped, so each look (one a second) sees what the test says: before the first
refresh a partition's load is unknown, and a stream opened then got a `scaling` event though
workers served the partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events import serving
from producer_api.events.protocol import JobEvent
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState
from shared.queue_position import PartitionLoad
from shared.settings import Settings
from tests.app_client import app_client

PARTITION = ("smollm2", "default")


@pytest.fixture
async def queued(redis_url: str) -> AsyncIterator[tuple[EventsService, str]]:
    """The events service and a generate job queued, its partition's load not known yet."""
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="standing-events")
    app = create_app(settings)
    async with app_client(app) as client:
        state: ProducerState = app.state.conveyor
        await state.eta_refresher.stop()
        state.queue_eta.loads = {}
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
        job_id = (await client.post("/v1/jobs", json=body)).json()["id"]
        yield EventsService(state, ANONYMOUS), job_id


async def _look(service: EventsService, job_id: str) -> list[str]:
    """The events one look at the job's standing sends (the stream's next event ends the looks
    right after it)."""
    first: asyncio.Future[JobEvent | None] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(first.set_result, None)
    return [event.event async for event in service._queued(job_id, first)]


async def test_an_unknown_load_is_no_reason_to_scale(queued: tuple[EventsService, str]) -> None:
    service, job_id = queued
    assert "scaling" not in await _look(service, job_id)
    service.state.queue_eta.loads = {PARTITION: PartitionLoad(serving=0, warming=1)}
    assert await _look(service, job_id) == ["scaling", "queued"]


async def test_scaling_stops_when_a_worker_comes_and_follows_again_if_it_dies(
    queued: tuple[EventsService, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, job_id = queued
    monkeypatch.setattr(serving, "QUEUED_EVERY_S", 0.0)
    loads = service.state.queue_eta.loads
    first: asyncio.Future[JobEvent | None] = asyncio.get_running_loop().create_future()
    looks = service._queued(job_id, first)
    loads[PARTITION] = PartitionLoad(serving=0)
    assert [(await anext(looks)).event for _ in range(2)] == ["scaling", "queued"]
    loads[PARTITION] = PartitionLoad(serving=1)  # its standing unchanged: nothing to send
    task = asyncio.ensure_future(anext(looks))
    await asyncio.sleep(0.05)
    assert not task.done()
    loads[PARTITION] = PartitionLoad(serving=0)  # that worker died before it took the job
    assert (await task).event == "scaling"
    first.set_result(None)  # the stream's next event: the looks end
    assert await anext(looks, None) is None


async def test_a_job_cancelled_while_scaling_ends_its_stream(
    queued: tuple[EventsService, str],
) -> None:
    service, job_id = queued
    service.state.queue_eta.loads[PARTITION] = PartitionLoad(serving=0)
    events = await service.open(job_id, None)
    assert events is not None
    assert [(await anext(events)).event for _ in range(2)] == ["scaling", "queued"]
    await service.jobs.cancel(job_id)
    final = await asyncio.wait_for(anext(events), 30)
    assert (final.event, final.data["status"], final.id) == ("final", "cancelled", "0-1")
    assert await anext(events, None) is None
