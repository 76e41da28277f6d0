"""A request without a valid API key is answered 401 before anything reads its body, on every
keyed route, as OpenAI's API, Triton and vLLM's server answer it: JSON that did not parse (or a
multipart form that did not) was a 422 or 400 first, so a caller that could not authenticate
learned how its body was validated. The key is still read once per request, against a producer
run in-process on a real Valkey."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import build_state, create_app
from shared.api_keys import ApiKeyStore, KeySpec, key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("auth-order:")
BROKEN_JSON = {"content": b"{not json", "headers": {"Content-Type": "application/json"}}
BROKEN_FORM = {"content": b"purpose=batch", "headers": {"Content-Type": "multipart/form-data"}}
# Every kind of keyed route, each sent a body it could not parse.
KEYED = [
    ("POST", "/v1/jobs", BROKEN_JSON),
    ("POST", "/v1/models/identity/predict", BROKEN_JSON),
    ("POST", "/v1/chat/completions", BROKEN_JSON),
    ("POST", "/v1/embeddings", BROKEN_JSON),
    ("POST", "/v1/batches", BROKEN_JSON),
    ("POST", "/v1/files", BROKEN_FORM),
    ("PUT", "/v1/models/identity/routes", BROKEN_JSON),
    ("POST", "/v1/models/identity/canary", BROKEN_JSON),
]
DONE = "auth-order-counted"
KEYLESS = [{}, {"Authorization": "Bearer cvk_not-a-real-key-at-all"}, {"X-API-Key": "short"}]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled"))
    async with app_client(app) as client:
        yield client


async def _key(aredis: aioredis.Redis, *scopes: str, **spec: Any) -> dict[str, str]:
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", frozenset(scopes), **spec))
    return {"Authorization": f"Bearer {key}"}


async def test_no_valid_key_is_401_before_the_body_is_read(producer: httpx.AsyncClient) -> None:
    for headers in KEYLESS:
        expected = await producer.get("/v1/models", headers=headers)  # a route with no body
        assert expected.status_code == 401
        for method, path, body in KEYED:
            sent = {**body["headers"], **headers}
            response = await producer.request(method, path, content=body["content"], headers=sent)
            assert response.status_code == 401, (method, path, headers, response.text)
            said, first = response.json()["error"], expected.json()["error"]
            # the same refusal, in OpenAI's shape (`param`, `code` too) on OpenAI's routes
            assert (said["type"], said["message"]) == (first["type"], first["message"]), path
            challenge = response.headers["www-authenticate"]
            assert challenge == expected.headers["www-authenticate"], (method, path)


async def _key_reads(aredis: aioredis.Redis, record: str, sent: Awaitable[None]) -> int:
    """How often the producer read the key's `record` (HGETALL) while `sent` ran, as MONITOR
    saw it: up to an ECHO sent after it, so every command before it is counted."""
    async with aredis.monitor() as monitor:
        await sent
        await aredis.echo(DONE)
        reads = 0
        while (command := (await monitor.next_command())["command"]) != f"ECHO {DONE}":
            reads += command == f"HGETALL {record}"
    return reads


async def test_a_valid_key_is_read_once_and_hears_what_is_wrong_with_its_body(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", frozenset({"admin"})))
    headers = {"Authorization": f"Bearer {key}"}

    refusals: list[str] = []

    async def send() -> None:
        for method, path, body in KEYED:
            sent = {**body["headers"], **headers}
            response = await producer.request(method, path, content=body["content"], headers=sent)
            assert response.status_code != 401, (method, path, response.text)
            refusals.append(response.text)
        assert (await producer.get("/v1/models", headers=headers)).status_code == 200

    reads = await _key_reads(aredis, KEYS.api_key(key_id_of(key)), send())
    assert reads == len(KEYED) + 1
    assert "body is not acceptable JSON" in refusals[0], refusals


async def test_open_routes_take_no_key(producer: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/openapi.json", "/console/login", "/metrics"):
        response = await producer.get(path, headers={"X-API-Key": "short"})
        assert response.status_code == 200, (path, response.text)


async def test_a_limited_key_is_counted_and_refused_as_before(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    headers = await _key(aredis, "read", rate_per_s=0.001, burst=1)
    first = await producer.get("/v1/models", headers=headers)
    assert first.status_code == 200
    assert first.headers["ratelimit-remaining"] == "0"
    second = await producer.get("/v1/models", headers=headers)
    assert second.status_code == 429
    assert "retry-after" in second.headers


async def test_a_body_too_large_with_a_valid_key_is_413(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    headers = await _key(aredis, "submit")
    body = b'{"model": "identity", "inputs": {"x": "' + b"a" * 2**20 + b'"}}'
    response = await producer.post("/v1/jobs", content=body, headers=headers)
    assert response.status_code == 413, response.text


async def test_a_key_checked_while_redis_is_down_is_503() -> None:
    """The early check's errors are answered by the app's handlers, as the route's were."""
    settings = Settings(redis_url="redis://127.0.0.1:1/0", auth="enabled")  # nothing listens
    app = create_app(settings)
    app.state.conveyor = build_state(settings)  # no I/O: no lifespan, which would wait for Redis
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        sent = {**BROKEN_JSON["headers"], "X-API-Key": "cvk_unverifiable-while-down"}
        response = await client.post("/v1/jobs", content=BROKEN_JSON["content"], headers=sent)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
