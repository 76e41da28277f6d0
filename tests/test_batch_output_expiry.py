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

import httpx
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
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", result_ttl_s=TTL_S
    )
    async with app_client(create_app(settings)) as client:
        yield client


@pytest.fixture
def sdk(producer: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai_sdk(producer)


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
    # its delete too, as OpenAI's of a file gone (it answered 200, `deleted: false`)
    with pytest.raises(openai.NotFoundError, match="expired"):
        await sdk.files.delete(batch.error_file_id)
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


def _policy(seconds: int, anchor: str | None = "created_at") -> dict[str, str]:
    """OpenAI's policy as flat fields, as `POST /v1/files` takes an upload's `expires_after`."""
    fields = {"output_expires_after[seconds]": str(seconds)}
    return fields | ({"output_expires_after[anchor]": anchor} if anchor else {})


async def _create_own(producer: httpx.AsyncClient, way: str, policy: dict[str, str]) -> Any:
    """Conveyor's own creates: the lines as the body, the options its query parameters, or a
    multipart upload, the options its form fields."""
    window = {"completion_window": "1h"}
    if way == "query":
        jsonl = {"Content-Type": "application/jsonl"}
        return await producer.post(
            "/v1/batches", params=window | policy, content=LINES, headers=jsonl
        )
    return await producer.post(
        "/v1/batches", params=window, data=policy, files={"file": ("b.jsonl", LINES)}
    )


@pytest.mark.parametrize("way", ["query", "form"])
async def test_conveyors_own_creates_take_the_policy_as_fields(
    producer: httpx.AsyncClient, way: str
) -> None:
    """Its query parameters were ignored (the files kept a result TTL), its form fields refused
    (422: not an option)."""
    created = await _create_own(producer, way, _policy(3600))
    assert created.status_code == 202, created.text
    batch = (await producer.post(f"/v1/batches/{created.json()['id']}/cancel")).json()
    errors = (await producer.get(f"/v1/files/{batch['error_file_id']}")).json()
    assert errors["expires_at"] == errors["created_at"] + 3600 == batch["cancelled_at"] + 3600


@pytest.mark.parametrize("way", ["query", "form"])
@pytest.mark.parametrize(
    ("policy", "needle"),
    [(_policy(60), "greater than or equal to 3600"), (_policy(3600, anchor=None), "anchor")],
)
async def test_conveyors_own_creates_refuse_a_policy_outside_openais(
    producer: httpx.AsyncClient,
    aredis: aioredis.Redis,
    way: str,
    policy: dict[str, str],
    needle: str,
) -> None:
    refused = await _create_own(producer, way, policy)
    assert refused.status_code == 422 and needle in refused.text, refused.text
    assert await aredis.keys(KEYS.batch("*")) == []
