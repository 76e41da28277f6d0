"""An uploaded file's object and life as OpenAI's SDK sees them, on a producer run in-process on
a real Valkey: the file object says when the file expires (`expires_at`) and carries the
deprecated `status` the SDK's type requires; both were missing, so a client could not tell its
file would be gone a result TTL after the upload, and the SDK's `wait_for_processing` polled
until its timeout. `expires_after`, which the SDK sends to shorten a file's life, was ignored:
the file was kept the whole result TTL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings

TTL_S = 7200  # the result TTL: the longest a file is kept
LINE = b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n'


@pytest.fixture
async def sdk(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[openai.AsyncOpenAI]:
    """OpenAI's client on the producer's app, started."""
    settings = Settings(redis_url=redis_url, auth="disabled", result_ttl_s=TTL_S)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield openai.AsyncOpenAI(
                base_url="http://localhost/v1", api_key="unused", http_client=http, max_retries=0
            )


async def _expiry_of(aredis: aioredis.Redis, file_id: str) -> int:
    """When the file's key expires, in s (Redis's own clock)."""
    return int(await aredis.execute_command("EXPIRETIME", Keys().file(file_id)))


async def test_the_file_object_says_when_the_file_expires(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis
) -> None:
    """Upload, retrieve and list answer the SDK's whole FileObject: `status` and `expires_at`,
    the second when the file's key does expire, a result TTL after the upload."""
    uploaded = await sdk.files.create(file=("a.jsonl", LINE), purpose="batch")
    assert uploaded.status == "processed"
    assert uploaded.expires_at == uploaded.created_at + TTL_S
    assert await _expiry_of(aredis, uploaded.id) == uploaded.expires_at
    assert await sdk.files.retrieve(uploaded.id) == uploaded
    assert [file async for file in sdk.files.list()] == [uploaded]


async def test_the_sdks_wait_for_processing_returns_an_upload(sdk: openai.AsyncOpenAI) -> None:
    """The SDK polls `retrieve` until `status` is `processed`, `error` or `deleted`: with no
    `status` it polled until `max_wait_seconds` (30 minutes by default) and raised."""
    uploaded = await sdk.files.create(file=("a.jsonl", LINE), purpose="batch")
    waited = await sdk.files.wait_for_processing(
        uploaded.id, poll_interval=0.01, max_wait_seconds=0
    )
    assert waited == uploaded


@pytest.mark.parametrize(("asked_s", "kept_s"), [(3600, 3600), (2_592_000, TTL_S)])
async def test_expires_after_shortens_a_files_life_to_the_result_ttl_at_most(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, asked_s: int, kept_s: int
) -> None:
    """An hour asked is an hour kept (the key, and the file object says so); OpenAI's 30 days
    is the result TTL, the longest Conveyor keeps a file, which `expires_at` says."""
    uploaded = await sdk.files.create(
        file=("a.jsonl", LINE),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": asked_s},
    )
    assert uploaded.expires_at == uploaded.created_at + kept_s
    assert await _expiry_of(aredis, uploaded.id) == uploaded.expires_at
    _, expiring = Keys().file_budget_of("default")  # its bytes leave the budget then too
    assert await aredis.zscore(expiring, uploaded.id) == uploaded.expires_at * 1000


async def test_an_expires_after_outside_openais_range_is_refused_by_name(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis
) -> None:
    """OpenAI takes 3600 to 2592000 seconds from `created_at`; less is a 400 that names the
    field, and nothing is stored."""
    with pytest.raises(openai.BadRequestError, match=r"expires_after\[seconds\]"):
        await sdk.files.create(
            file=("a.jsonl", LINE),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )
    assert await aredis.keys(Keys().file("*")) == []
