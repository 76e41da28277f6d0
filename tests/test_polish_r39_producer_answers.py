"""What a client reads off the producer's refusals (README, API errors): a 405's Allow lists
HEAD wherever it lists GET (every GET route answers HEAD, `HeadAsGet`; RFC 9110 10.2.1), and a
completion's unsupported `suffix` is refused in words, not pydantic's "Input should be ''". A
producer served in-process over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="polish-r39-answers")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_a_405s_allow_lists_head_beside_get(producer: httpx.AsyncClient) -> None:
    """Each path answers HEAD as it lists it; one without GET lists no HEAD either."""
    for method, path, allow in [
        ("PUT", "/v1/files", "GET, HEAD, POST"),
        ("PATCH", "/v1/jobs/0123", "DELETE, GET, HEAD"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("DELETE", "/v1/jobs", "POST"),
    ]:
        answer = await producer.request(method, path)
        assert answer.status_code == 405, (path, answer.text)
        assert answer.headers["allow"] == allow, path
        if "HEAD" in allow:
            assert (await producer.head(path)).status_code != 405, path


async def test_a_completions_suffix_is_refused_saying_what_is_supported(
    producer: httpx.AsyncClient,
) -> None:
    """400 in OpenAI's shape naming `suffix`, its message saying what to send; "" still taken."""
    body = {"model": "smollm2", "prompt": "hi", "suffix": "x"}
    answer = await producer.post("/v1/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "suffix",
        None,
    )
    assert error["message"] == "suffix: not supported: send null or omit it", error
    for taken in ("", None):  # refused for its max_tokens alone, never reaching a worker
        bad = {"model": "smollm2", "prompt": "hi", "suffix": taken, "max_tokens": 0}
        answer = await producer.post("/v1/completions", json=bad)
        assert answer.json()["error"]["param"] == "max_tokens", answer.text
