"""One reader of `Idempotency-Key` for every route that takes it: a malformed key is the same
422 on each, and OpenAPI documents the header on each. `POST /v1/batches` declared its own
FastAPI header, and refused "a b" with `header.Idempotency-Key: String should match pattern
'^[\\x21-\\x7e]+$'` where the job submits named the rule."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

# Each route's path and a body it takes.
KEYED = {
    "/v1/jobs": {"model": "identity", "inputs": {"x": 1}},
    "/v1/models/identity/predict": {"inputs": {"x": 1}},
    "/v1/batches": {"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}},
}
REFUSAL = {
    "error": {
        "type": "invalid_request",
        "message": "Idempotency-Key: 1 to 255 printable ASCII characters, no spaces",
    }
}


@pytest.mark.parametrize("key", ["a b", "k" * 256, "é"])
async def test_a_malformed_key_is_one_422_on_every_route(
    redis_url: str, aredis: aioredis.Redis, key: str
) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="key-format")
    async with app_client(create_app(settings)) as client:
        answers = [
            await client.post(
                path,
                json=body,
                headers={"Idempotency-Key": key.encode()},
            )
            for path, body in KEYED.items()
        ]
    assert [(a.status_code, a.json()) for a in answers] == [(422, REFUSAL)] * 3


async def test_openapi_documents_the_key_on_every_route_that_takes_it(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    operations = create_app(Settings(redis_url=redis_url)).openapi()["paths"]
    documented = [
        [p for p in operations[path]["post"]["parameters"] if p["name"] == "Idempotency-Key"]
        for path in ("/v1/jobs", "/v1/models/{model}/predict", "/v1/batches")
    ]
    assert all(len(params) == 1 for params in documented), documented
    assert documented[0] == documented[1] == documented[2]
