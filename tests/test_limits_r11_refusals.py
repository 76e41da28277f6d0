"""A key's token and refusals past its key check, on a producer run in-process on a real
Valkey. Like every other answer once the key is known, they carry `Cache-Control: no-store`
(README, "Tenant isolation"): the 429 of an empty bucket and the 403 of a missing scope had
none, so a shared cache keyed by URL alone, set to keep error answers (nginx's
`proxy_cache_valid any`), served one tenant's 429, naming its rate, to every other tenant asking
for that URL. And the token is taken before the body is read, as a gateway limits requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("limits-r11:")


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled"))
    async with app_client(app) as client:
        yield client


async def test_a_rate_limited_answer_is_not_stored_by_shared_caches(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    spec = KeySpec("acme", frozenset({"read"}), rate_per_s=1e-6, burst=1)
    key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    headers = {"Authorization": f"Bearer {key}"}
    assert (await producer.get("/v1/models", headers=headers)).status_code == 200
    refused = await producer.get("/v1/models", headers=headers)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1000000"  # a token every 10^6 s
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers.get("Cache-Control") == "no-store"


async def test_a_scope_refusal_is_not_stored_by_shared_caches(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", frozenset({"read"})))
    job = {"model": "identity", "inputs": {"x": 1}}
    refused = await producer.post("/v1/jobs", json=job, headers={"X-API-Key": key})
    assert refused.status_code == 403
    assert refused.headers.get("Cache-Control") == "no-store"


async def test_a_key_at_its_limit_is_refused_before_its_body_is_read(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """The boundary read and parsed each body (up to 1 MiB of JSON, 100 MiB of upload) before
    the route's dependency took the token: a key at its limit still had every body read, and
    one the boundary refused (JSON that did not parse) was never counted at all."""
    spec = KeySpec("acme", frozenset({"submit"}), rate_per_s=1e-6, burst=2)
    key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    unparsed = await producer.post("/v1/jobs", content=b"{not json", headers=headers)
    assert unparsed.status_code == 422
    assert unparsed.headers["RateLimit-Remaining"] == "1"  # counted as any other request
    job = b'{"model": "identity", "inputs": {"x": 1}}'
    assert (await producer.post("/v1/jobs", content=job, headers=headers)).status_code == 202
    refused = await producer.post("/v1/jobs", content=b"{not json", headers=headers)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "1000000"
