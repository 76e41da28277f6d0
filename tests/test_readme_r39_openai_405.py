"""README, API errors: a wrong method on one of OpenAI's routes is a 405 in OpenAI's shape, as
every other error there. `PUT /v1/files` and `DELETE /v1/models` answered Conveyor's shape (the
route that marks its requests OpenAI's never ran), while the completion routes' 405 was
OpenAI's already; Conveyor's own routes keep Conveyor's shape."""

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

KEYS = Keys("readme-r39-405:")
OPENAI_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled")
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", frozenset({"read"})))
    async with app_client(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client


async def test_a_wrong_method_on_openais_routes_is_openais_405(
    producer: httpx.AsyncClient,
) -> None:
    for method, path, allow in [
        ("PUT", "/v1/files", "GET, HEAD, POST"),
        ("PATCH", "/v1/files/file-abc", "DELETE, GET, HEAD"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("PUT", "/v1/models/minilm", "GET, HEAD"),
    ]:
        answer = await producer.request(method, path)
        assert answer.status_code == 405, (path, answer.text)
        assert answer.json()["error"].keys() == OPENAI_FIELDS, (path, answer.text)
        assert answer.headers["allow"] == allow, path
        assert (await producer.head(path)).status_code != 405, path  # as Allow lists it
    for method, path, allow in [
        ("PATCH", "/v1/jobs/0123", "DELETE, GET, HEAD"),
        ("PUT", "/v1/jobs", "POST"),
    ]:
        jobs = await producer.request(method, path)  # Conveyor's own routes keep its shape
        assert jobs.status_code == 405 and jobs.json()["error"].keys() == {"type", "message"}
        assert jobs.headers["allow"] == allow, path
