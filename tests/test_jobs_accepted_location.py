"""Every 202 that accepts a job or a batch names its URL in `Location`, as an asynchronous
request-reply API's 202 does (clients and gateways that poll follow the header, not a body
they do not know): a submit, a submit whose `wait` ran out, a predict still running, a batch's
create. A producer served in-process over a real Valkey, no worker: each job stays queued."""

from __future__ import annotations

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

JOB = {"model": "identity", "inputs": {"x": 1}}
LINE = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'


async def test_every_202_names_its_url_in_location(redis_url: str, aredis: aioredis.Redis) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="located")
    async with app_client(create_app(settings)) as client:
        answers = [
            await client.post("/v1/jobs", json=JOB),
            await client.post("/v1/jobs", params={"wait": 0.1}, json=JOB),
            await client.post(
                "/v1/models/identity/predict", params={"timeout": 0.1}, json={"inputs": {"x": 1}}
            ),
            await client.post(
                "/v1/batches", content=LINE, headers={"content-type": "application/jsonl"}
            ),
        ]
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    for answer in answers:
        assert answer.headers["Location"] == answer.json()["urls"]["self"], answer.headers
