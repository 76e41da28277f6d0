"""A batch whose create found no valid line ends `failed` at once, without a finalizer: its error
file (the refused lines) is kept as its create's `output_expires_after` asked, from its end, as a
completed batch's is, and its refused lines' key expires then; it kept them its window and a
result TTL from its create whatever was asked. A producer run in-process on a real Valkey, no
worker."""

from __future__ import annotations

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from tests.app_client import openai_sdk
from tests.test_batch_output_expiry import (
    KEYS,
    TTL_S,
    producer,  # noqa: F401 (a fixture)
)

LINES = b'{"custom_id": "a", "body": {"model": "no-such-model", "inputs": {}}}\n'


@pytest.mark.parametrize(("asked_s", "kept_s"), [(3600, 3600), (None, TTL_S)])
async def test_a_failed_batchs_error_file_expires_as_its_create_asked(
    producer: httpx.AsyncClient,  # noqa: F811
    aredis: aioredis.Redis,
    asked_s: int | None,
    kept_s: int,
) -> None:
    sdk: openai.AsyncOpenAI = openai_sdk(producer)
    upload = await sdk.files.create(file=("b.jsonl", LINES), purpose="batch")
    policy = {"anchor": "created_at", "seconds": asked_s} if asked_s else openai.NOT_GIVEN
    batch = await sdk.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/jobs",  # type: ignore[arg-type]  # Conveyor's own route
        completion_window="1h",  # type: ignore[arg-type]  # within the result TTL
        output_expires_after=policy,  # type: ignore[arg-type]
    )
    assert batch.status == "failed" and batch.error_file_id and batch.failed_at, batch
    errors = await sdk.files.retrieve(batch.error_file_id)
    assert errors.created_at == batch.failed_at
    assert errors.expires_at == batch.failed_at + kept_s
    rejected = KEYS.batch_rejected(batch.id)
    assert await aredis.execute_command("EXPIRETIME", rejected) == errors.expires_at
    # the batch itself is kept a result TTL from its end, as a completed one
    assert (
        await aredis.execute_command("EXPIRETIME", KEYS.batch(batch.id))
        >= errors.created_at + TTL_S
    )
    assert (await sdk.files.content(batch.error_file_id)).text.count("\n") == 1
