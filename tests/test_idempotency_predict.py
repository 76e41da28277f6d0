"""`POST /v1/models/{model}/predict` with an Idempotency-Key, on a producer served in-process
over a real Valkey with no worker for its model (so a predict's wait runs out: a 202 with the
job). The route ignored the header: a client's retry after a lost answer enqueued, and ran, the
job a second time."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

PREDICT = "/v1/models/identity/predict"


async def test_a_keyed_predict_repeated_answers_with_its_first_job(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="predict-key")
    body = {"inputs": {"x": uuid.uuid4().hex}}
    key = {"Idempotency-Key": f"predict-{uuid.uuid4().hex}"}
    lane = Keys().queue("identity", "default")
    async with app_client(create_app(settings)) as client:
        before = await aredis.xlen(lane)
        first = await client.post(PREDICT, params={"timeout": 0.2}, json=body, headers=key)
        again = await client.post(PREDICT, params={"timeout": 0.2}, json=body, headers=key)
        other = await client.post(
            PREDICT, params={"timeout": 0.2}, json={"inputs": {"x": 1}}, headers=key
        )
        spaced = await client.post(PREDICT, json=body, headers={"Idempotency-Key": "a b"})
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["urls"]["self"].endswith(first.json()["id"])
    assert other.status_code == 409 and "different body" in other.text, other.text
    assert spaced.status_code == 422 and "Idempotency-Key" in spaced.text, spaced.text
    assert await aredis.xlen(lane) == before + 1  # one job enqueued for the three
