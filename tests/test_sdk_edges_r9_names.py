"""A 404 that names nothing is reported naming what was asked for: an id holding `/` is sent as
one URL segment (`a%2Fb`), but the producer's router decodes it before routing, so it reaches
no route and its answer was a bare "Not Found", which named neither the job nor its id. An
error's `request_id` is the answer's `X-Request-ID`. A producer served in-process over a real
Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import redis.asyncio as aioredis

from conveyor.client import APIError, AsyncClient, NotFound
from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings


@pytest.fixture
async def client(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[AsyncClient]:
    """The SDK speaking to a producer served here, with no socket; an unhandled error is
    answered as the producer's server answers it (500), not raised into the test."""
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="sdk-edges-r9")
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with app.router.lifespan_context(app), AsyncClient("http://localhost") as sdk:
        await sdk.http.aclose()
        sdk.http = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        yield sdk


async def _first_event(sdk: AsyncClient, job_id: str) -> object:
    """A job's event stream, opened and read up to its first event."""
    async for event in sdk.stream(job_id):
        return event
    return None


CALLS: list[tuple[str, Callable[[AsyncClient, str], Awaitable[object]]]] = [
    ("job", lambda sdk, id_: sdk.get(id_)),
    ("job", lambda sdk, id_: sdk.cancel(id_)),
    ("job", _first_event),
    ("batch", lambda sdk, id_: sdk.batches.get(id_)),
    ("file", lambda sdk, id_: sdk.files.content(id_)),
]


@pytest.mark.parametrize(("kind", "call"), CALLS, ids=["get", "cancel", "stream", "batch", "file"])
async def test_a_missing_id_holding_a_slash_is_named(
    client: AsyncClient, kind: str, call: Callable[[AsyncClient, str], Awaitable[object]]
) -> None:
    with pytest.raises(NotFound) as raised:
        await call(client, "a/b")
    assert raised.value.message == f"{kind} a/b not found"


async def test_the_producers_own_404_is_kept(client: AsyncClient) -> None:
    """An id that reaches its route keeps the producer's message (and a space travels)."""
    with pytest.raises(NotFound) as raised:
        await client.get("a b")
    assert raised.value.message == "job a b not found"


async def test_an_internal_errors_request_id_is_on_the_error(
    client: AsyncClient, aredis: aioredis.Redis
) -> None:
    """The id the producer logged the traceback under, to quote to its operator, as OpenAI's
    SDK errors carry it: a job record of the wrong type fails the producer's read of it."""
    job_id = "0" * 32
    await aredis.set(Keys().job(job_id), "not a hash")
    with pytest.raises(APIError) as raised:
        await client.get(job_id)
    assert raised.value.status == 500
    assert raised.value.request_id is not None
    assert raised.value.request_id in raised.value.message
