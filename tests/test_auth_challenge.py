"""What a refused key is told, against a producer run in-process on a real Valkey: 401 with
RFC 6750's challenge, `error="invalid_token"` for a key presented and refused (unknown, revoked,
expired, malformed), none for a request that presented no key (a wrong scheme presents none).
Every 401 had said only `Bearer`, so a client could not tell a bad key from a missing one."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec, key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("auth-challenge:")
INVALID = 'Bearer error="invalid_token"'


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled"))
    async with app_client(app) as client:
        yield client


async def _refused_keys(aredis: aioredis.Redis) -> list[str]:
    """A revoked key, an expired one, an unknown one and a malformed one."""
    store = ApiKeyStore(aredis, KEYS)
    revoked, _ = await store.create(KeySpec("acme", frozenset({"read"})))
    await store.revoke(key_id_of(revoked))
    expired, _ = await store.create(KeySpec("acme", frozenset({"read"}), expires_at=1.0))
    assert time.time() > 1.0
    return [revoked, expired, "cvk_not-a-real-key-at-all", "short"]


async def test_a_refused_key_is_an_invalid_token(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    for key in await _refused_keys(aredis):
        for headers in ({"Authorization": f"Bearer {key}"}, {"X-API-Key": key}):
            response = await producer.get("/v1/models", headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert response.headers["www-authenticate"] == INVALID, headers


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Basic Zm9vOmJhcg=="}, {"Authorization": "Bearer"}, {"X-API-Key": ""}],
)
async def test_no_key_is_a_bare_challenge(
    producer: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    response = await producer.get("/v1/jobs/0123456789abcdef0123456789abcdef", headers=headers)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["message"].startswith("an API key is required")
