"""OpenAI's `output_expires_after` on `POST /v1/batches`: the batch's output and error files are
kept that long from their creation (the batch's end), the result TTL at most, as an upload's
`expires_after` is; their file objects say so, the keys they are read from expire then, and they
answer 404 after. The create refused the field (its body forbids extras), so OpenAI's client
could not send it. A producer run in-process on a real Valkey, spoken to by OpenAI's client; no
worker reads its lanes, so a cancel ends the batch (its error file: the invalid line and the
cancelled one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

KEYS = Keys("batch-expiry:")
TTL_S = 7200  # the result TTL: the longest a file is kept
LINES = (
    b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
    b'{"custom_id": "b", "body": {"model": "no-such-model", "inputs": {}}}\n'
)


@pytest.fixture
async def sdk(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[openai.AsyncOpenAI]:
    """After `aredis` has flushed the database."""
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", result_ttl_s=TTL_S
    )
    async with app_client(create_app(settings)) as client:
        yield openai_sdk(client)


async def _create(sdk: openai.AsyncOpenAI, policy: dict[str, Any]) -> str:
    upload = await sdk.files.create(file=("b.jsonl", LINES), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/jobs",  # type: ignore[arg-type]  # Conveyor's own route
        completion_window="1h",  # type: ignore[arg-type]  # within the result TTL
        output_expires_after=policy,  # type: ignore[arg-type]  # refusals send bad ones too
    )
    return batch.id


async def _expiry(aredis: aioredis.Redis, key: str) -> int:
    """When `key` expires, in s (Redis's own clock)."""
    return int(await aredis.execute_command("EXPIRETIME", key))


@pytest.mark.parametrize(("asked_s", "kept_s"), [(3600, 3600), (2_592_000, TTL_S)])
async def test_a_batchs_files_expire_as_its_create_asked(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, asked_s: int, kept_s: int
) -> None:
    batch_id = await _create(sdk, {"anchor": "created_at", "seconds": asked_s})
    batch = await sdk.batches.cancel(batch_id)
    assert batch.status == "cancelled" and batch.error_file_id, batch
    errors = await sdk.files.retrieve(batch.error_file_id)
    assert errors.created_at == batch.cancelled_at  # its anchor: the file's creation
    assert errors.expires_at == errors.created_at + kept_s
    [job_id] = [i.decode() for i in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]
    read_from = [KEYS.batch_items(batch_id), KEYS.batch_rejected(batch_id), KEYS.job(job_id)]
    assert [await _expiry(aredis, key) for key in read_from] == [errors.expires_at] * 3
    if kept_s < TTL_S:  # the batch itself is kept the result TTL still
        assert await _expiry(aredis, KEYS.batch(batch_id)) >= errors.created_at + TTL_S


async def test_an_expired_batch_file_is_not_found_and_its_batch_stays(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis
) -> None:
    batch_id = await _create(sdk, {"anchor": "created_at", "seconds": 3600})
    batch = await sdk.batches.cancel(batch_id)
    assert batch.error_file_id and batch.cancelled_at
    # an hour on: the batch ended an hour ago (its keys' TTLs are Redis's to count down)
    await aredis.hset(KEYS.batch(batch_id), "cancelled_at", (batch.cancelled_at - 3600) * 1000)
    with pytest.raises(openai.NotFoundError, match="expired"):
        await sdk.files.retrieve(batch.error_file_id)
    with pytest.raises(openai.NotFoundError, match="expired"):
        await sdk.files.content(batch.error_file_id)
    assert (await sdk.batches.retrieve(batch_id)).error_file_id == batch.error_file_id


@pytest.mark.parametrize(
    ("policy", "param", "needle"),
    [
        ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds", "3600"),
        ({"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after.seconds", "2592000"),
        ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor", "created_at"),
        ({"seconds": 3600}, "output_expires_after.anchor", "required"),
    ],
)
async def test_a_policy_outside_openais_is_refused_by_name(
    sdk: openai.AsyncOpenAI, aredis: aioredis.Redis, policy: dict[str, Any], param: str, needle: str
) -> None:
    """OpenAI's one anchor, 3600 to 2592000 seconds: else OpenAI's 400, naming the field, and
    no batch stored."""
    with pytest.raises(openai.BadRequestError) as refused:
        await _create(sdk, policy)
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error", error
    assert error["param"] == param and needle in error["message"], error
    assert await aredis.keys(KEYS.batch("*")) == []
