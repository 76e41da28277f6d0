"""Every error on OpenAI's routes answers in OpenAI's shape, `{"error": {"message", "type",
"param", "code"}}`, on a producer run in-process on a real Valkey: a 401 (no key, a wrong one),
a 413 (declared or chunked), a 429 (rate limit, too many in flight), an unknown route under
`/v1/` and a 405 kept Conveyor's `{"error": {"type", "message"}}`, and OpenAI's SDK read no
`e.code` of them. Their headers stay (`WWW-Authenticate`, `Retry-After`, RateLimit-*)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from conveyor.stack import free_port
from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("openai-r27:")
CHAT = "/v1/chat/completions"
CHAT_BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MAX_BODY = 400
OPENAI_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="enabled", max_body_bytes=MAX_BODY
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def _key(aredis: aioredis.Redis, **spec: Any) -> dict[str, str]:
    scopes = frozenset({"submit", "read"})
    key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec("acme", scopes, **spec))
    return {"Authorization": f"Bearer {key}"}


def _openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The response's error, checked to be OpenAI's object and nothing but its fields."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == OPENAI_FIELDS, response.text
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def _sdk(client: httpx.AsyncClient, auth: dict[str, str]) -> openai.AsyncOpenAI:
    key = auth.get("Authorization", "Bearer none").removeprefix("Bearer ")
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key=key, http_client=client, max_retries=0
    )


async def test_a_401_is_openais_with_its_challenge(producer: httpx.AsyncClient) -> None:
    """On the completion routes, and on the Files API and retrieve-model, which OpenAI's SDK
    calls too: refused before any route ran. Conveyor's own routes keep Conveyor's shape."""
    for headers in ({}, {"Authorization": "Bearer cvk_not-a-real-key-at-all"}):
        for method, path in [
            ("POST", CHAT),
            ("POST", "/v1/embeddings"),
            ("GET", "/v1/files"),
            ("GET", "/v1/models/smollm2"),
        ]:
            response = await producer.request(method, path, json=CHAT_BODY, headers=headers)
            error = _openai_error(response, 401)
            assert error["code"] == "invalid_api_key", (path, error)
            assert response.headers["www-authenticate"].startswith("Bearer"), path
        jobs = await producer.get("/v1/jobs/abc", headers=headers)
        assert jobs.json()["error"].keys() == {"type", "message"}, jobs.text
    with pytest.raises(openai.AuthenticationError) as refused:
        await _sdk(producer, {"Authorization": "Bearer cvk_wrong"}).embeddings.create(
            model="minilm", input="hi"
        )
    assert refused.value.code == "invalid_api_key"


async def test_a_body_too_large_is_openais_413(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    auth = await _key(aredis)
    big = {**CHAT_BODY, "messages": [{"role": "user", "content": "a" * MAX_BODY}]}
    declared = await producer.post(CHAT, json=big, headers=auth)
    assert _openai_error(declared, 413)["type"] == "payload_too_large"

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "smollm2", "prompt": "'
        for _ in range(4):
            yield b"a" * MAX_BODY
        yield b'"}'

    sent = {**auth, "Content-Type": "application/json"}
    chunked = await producer.post("/v1/completions", content=chunks(), headers=sent)
    assert chunked.request.headers.get("transfer-encoding") == "chunked"
    assert _openai_error(chunked, 413)["type"] == "payload_too_large"


async def test_a_rate_limit_is_openais_429_with_its_headers(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    auth = await _key(aredis, rate_per_s=0.001, burst=1)
    first = await producer.post(CHAT, json={**CHAT_BODY, "messages": []}, headers=auth)
    assert first.status_code == 400, first.text  # the one token spent, nothing enqueued
    limited = await producer.post(CHAT, json=CHAT_BODY, headers=auth)
    error = _openai_error(limited, 429)
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.headers["ratelimit-remaining"] == "0"
    with pytest.raises(openai.RateLimitError) as refused:
        await _sdk(producer, auth).completions.create(model="smollm2", prompt="hi")
    assert refused.value.code == "rate_limit_exceeded"


async def test_too_many_in_flight_is_openais_429(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """The key's one job in flight is a Conveyor job no worker runs: the completion is refused
    before it is enqueued."""
    auth = await _key(aredis, max_in_flight=1)
    job = {"model": "identity", "inputs": {"x": "held"}}
    held = await producer.post("/v1/jobs", json=job, headers=auth)
    assert held.status_code == 202, held.text
    refused = await producer.post(CHAT, json=CHAT_BODY, headers=auth)
    error = _openai_error(refused, 429)
    assert error["type"] == "too_many_in_flight" and error["code"] is None
    assert "retry-after" in refused.headers


async def test_unknown_routes_and_methods_under_v1_are_openais(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """An OpenAI API Conveyor lacks (`/v1/responses`) is a 404 its SDK reads; a method a
    completion route does not take is a 405 naming the one it does."""
    auth = await _key(aredis)
    unknown = await producer.post("/v1/responses", json={"model": "smollm2"}, headers=auth)
    assert _openai_error(unknown, 404)["type"] == "not_found"
    with pytest.raises(openai.NotFoundError):
        await _sdk(producer, auth).responses.create(model="smollm2", input="hi")
    wrong_method = await producer.get(CHAT, headers=auth)
    _openai_error(wrong_method, 405)
    assert wrong_method.headers["allow"] == "POST"
    # an unknown job on Conveyor's own route under /v1 stays in Conveyor's shape
    job = await producer.get(f"/v1/jobs/{'0' * 32}", headers=auth)
    assert job.status_code == 404 and job.json()["error"].keys() == {"type", "message"}


async def test_openais_routes_document_their_errors_as_answered(
    producer: httpx.AsyncClient,
) -> None:
    schema = (await producer.get("/openapi.json")).json()
    for path in (CHAT, "/v1/embeddings"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("401", "413", "429", "503", "504"):
            body = responses[status]["content"]["application/json"]["schema"]
            assert body["$ref"].endswith("/OpenAIErrorBody"), (path, status, body)


async def test_redis_unreachable_is_openais_503() -> None:
    """A Redis address nothing listens on."""
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", auth="disabled")
    async with app_client(create_app(settings)) as client:
        response = await client.post(CHAT, json=CHAT_BODY)
    assert _openai_error(response, 503)["type"] == "unavailable"
    assert response.headers["retry-after"] == "1"
