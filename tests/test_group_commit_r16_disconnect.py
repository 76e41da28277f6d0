"""An idempotency-keyed submit-and-wait whose client left mid-wait, retried with its key, gets
the job its first try made: one job, the key still naming it, no 409 (the 499 of the first try
gave nothing back, and enqueued nothing more)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_long_poll_r13_disconnect import PREFIX, QUEUED, WAIT, Leaving, Producer, _left

KEY = b"r16-left-mid-wait"


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[Producer]:
    app = create_app(Settings(redis_url=redis_url, key_prefix=PREFIX, auth="disabled"))
    async with app_client(app) as client:
        yield Producer(app, client)


class KeyedLeaving(Leaving):
    """A leaving client's request that carries an Idempotency-Key."""

    def scope(self) -> dict[str, Any]:
        scope = super().scope()
        return {**scope, "headers": [*scope["headers"], (b"idempotency-key", KEY)]}


async def test_a_keyed_submit_whose_client_left_is_the_retrys_job(
    producer: Producer, aredis: aioredis.Redis
) -> None:
    first = KeyedLeaving("POST", f"/v1/jobs?wait={WAIT}", orjson.dumps(QUEUED))
    assert (await _left(producer, first)).status() == 499
    retry = await producer.client.post(
        "/v1/jobs", json=QUEUED, headers={"Idempotency-Key": KEY.decode()}
    )
    assert retry.status_code == 200, retry.text  # the first try's job, not a new one
    jobs = [key async for key in aredis.scan_iter(f"{PREFIX}job:*")]
    job_id = retry.json()["id"]
    assert [key.decode().rsplit(":", 1)[-1].translate({123: None, 125: None}) for key in jobs] == [
        job_id
    ]
    claims = [await aredis.get(key) async for key in aredis.scan_iter(f"{PREFIX}idem:*")]
    assert [claim.decode().split(":")[0] for claim in claims] == [job_id]
