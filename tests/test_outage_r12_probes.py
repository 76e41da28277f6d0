"""The probes of a producer served in this process, on the session's Valkey: readiness goes
false as soon as the producer is asked to exit (before any wait is ended, so a load balancer
stops sending first), and a Redis-side startup that fails otherwise than by Redis (a value read
that does not parse) leaves the producer alive and unready, not unable to start at all."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aioredis
from sse_starlette.sse import AppStatus

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async


def _settings(redis_url: str, prefix: str) -> Settings:
    return Settings(redis_url=redis_url, auth="disabled", instance_id=prefix, key_prefix=prefix)


async def test_readiness_goes_false_as_soon_as_the_producer_is_asked_to_exit(
    redis_url: str,
) -> None:
    """Readiness said ready for the whole drain, so a load balancer kept sending new requests
    to a producer about to end them."""
    app = create_app(_settings(redis_url, f"r12-exit-{uuid.uuid4().hex[:6]}:"))
    async with app_client(app) as client:
        assert (await client.get("/readyz")).status_code == 200
        AppStatus.should_exit = True
        try:
            ready = await client.get("/readyz")
            alive = await client.get("/healthz")
        finally:
            AppStatus.should_exit = False
    assert ready.status_code == 503, ready.text
    assert ready.headers["Retry-After"] == "1"
    assert ready.json()["error"]["type"] == "unavailable"
    assert alive.status_code == 200


async def test_a_startup_failing_otherwise_than_by_redis_leaves_the_producer_up_and_unready(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A live routes document that does not parse (an operator's slip) raised out of the first
    try of the Redis-side startup, and the producer could not start at all (a crash loop); the
    same error in a later try was logged and tried again. Now the producer starts alive and
    unready, naming the error's class, and is ready once the document is mended."""
    prefix = f"r12-start-{uuid.uuid4().hex[:6]}:"
    routes = Keys(prefix).routes("identity")
    await aredis.hset(routes, mapping={"doc": "{not json", "version": 1})
    app = create_app(_settings(redis_url, prefix))
    async with app_client(app) as client:
        alive = await client.get("/healthz")
        unready = await client.get("/readyz")
        await aredis.delete(routes)
        await until_async(lambda: _ready(client))
    assert alive.status_code == 200
    assert unready.status_code == 503 and "JSONDecodeError" in unready.text, unready.text


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200
