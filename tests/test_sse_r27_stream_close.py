"""A job-events stream closed between two events while its job is still queued (sse-starlette
closes it so when a send fails: the client went away), on a real Valkey with the producer
in-process (no worker: the job stays queued). The key check's `while_holds` around the events
was left to the garbage collector: finalized while the events under it were still closing,
its own close failed ("aclose(): asynchronous generator is already running") and asyncio
logged it as an error ("Task exception was never retrieved") for every such client."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.api_router import server_sent
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState
from shared.settings import Settings
from tests.app_client import app_client

BODY = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}


@pytest.fixture
async def producer(redis_url: str) -> AsyncIterator[tuple[ProducerState, httpx.AsyncClient]]:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="sse-r27-close"))
    async with app_client(app) as client:
        yield app.state.conveyor, client


async def test_a_queued_jobs_stream_closed_between_events_fails_nothing(
    producer: tuple[ProducerState, httpx.AsyncClient],
) -> None:
    state, client = producer
    await client.post("/v1/jobs", json=BODY)  # ahead of it: the job waits with a position
    job_id = (await client.post("/v1/jobs", json=BODY)).json()["id"]
    loop = asyncio.get_running_loop()
    failures: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: failures.append(context))
    try:
        opened = await EventsService(state, ANONYMOUS).open(job_id, None)
        assert opened is not None
        body = server_sent(opened, anyio.Event())  # the route's body iterator
        assert (await anext(body)).event in {"queued", "scaling"}
        await body.aclose()  # as sse-starlette closes it when a send fails: at a yield
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert [context["message"] for context in failures] == []
