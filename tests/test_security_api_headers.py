"""What a keyed answer tells the caches between client and producer, in-process on a real
Valkey: nothing shared may keep it. A cache keyed by URL alone (Varnish's default, which heeds
`Authorization` but not `X-API-Key`) would serve one tenant's `GET /v1/files` to the next."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings

KEYS = Keys("security-headers:")


async def test_every_keyed_answer_is_no_store(redis_url: str, aredis: aioredis.Redis) -> None:
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", frozenset({"read"})))
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            client.headers["X-API-Key"] = key
            for path in ("/v1/files", "/v1/batches", "/v1/models", f"/v1/jobs/{'0' * 32}"):
                answer = await client.get(path)
                assert answer.headers.get("cache-control") == "no-store", (path, answer.headers)
