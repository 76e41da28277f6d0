"""A batch line's body is held to the limits of the route it names, as OpenAI's Batch API holds
each request: CONVEYOR_MAX_BODY_BYTES and CONVEYOR_MAX_JSON_DEPTH counted the line around it
(its `custom_id`, up to 512 characters, and its own object's level), so a body `POST /v1/jobs`
takes was refused as a line. A producer served in-process over a real Valkey; no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import dumps
from shared.settings import Settings
from tests.app_client import app_client

MAX_BODY = 1024
MAX_DEPTH = 4
JSON = {"Content-Type": "application/json"}


def nested(levels: int) -> dict[str, Any]:
    """A job body whose inputs reach `levels` levels of containers below the body's own."""
    value: Any = 1
    for _ in range(levels - 2):
        value = [value]
    return {"model": "identity", "inputs": {"x": value}}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url,
        auth="disabled",
        instance_id="batch-r23-limits",
        max_body_bytes=MAX_BODY,
        max_json_depth=MAX_DEPTH,
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_a_lines_body_is_held_to_the_routes_limits_not_the_line(
    producer: httpx.AsyncClient,
) -> None:
    """Bodies the route takes (the largest size with a long custom_id, the deepest nesting) are
    lines the batch takes; one past each is refused alone, as on the route."""
    text = "x" * (MAX_BODY - 100)  # the body's JSON adds 45 bytes
    bodies = {
        "long-id-" + "i" * 400: {"model": "identity", "inputs": {"text": text}},
        "deepest": nested(MAX_DEPTH),
        "too-big": {"model": "identity", "inputs": {"text": "x" * MAX_BODY}},
        "too-deep": nested(MAX_DEPTH + 1),
    }
    taken = {}
    for custom_id, body in bodies.items():
        alone = await producer.post("/v1/jobs", content=dumps(body), headers=JSON)
        taken[custom_id] = alone.status_code < 400
    assert taken == dict(zip(bodies, [True, True, False, False], strict=True)), taken
    lines = b"".join(dumps({"custom_id": c, "body": b}) + b"\n" for c, b in bodies.items())
    assert len(lines.splitlines()[0]) > MAX_BODY  # the line itself is over the body limit
    created = await producer.post(
        "/v1/batches", content=lines, headers={"Content-Type": "application/jsonl"}
    )
    assert created.status_code == 202, created.text
    batch = created.json()
    refused = {error["line"]: error for error in batch["errors"]["data"]}
    assert sorted(refused) == [3, 4], refused
    assert refused[3]["code"] == "payload_too_large", refused
    assert "CONVEYOR_MAX_BODY_BYTES" in refused[3]["message"], refused
    assert "nested deeper" in refused[4]["message"], refused
    assert batch["counts"]["total"] - batch["counts"]["invalid"] == 2, batch
    assert (await producer.post(f"/v1/batches/{batch['id']}/cancel")).status_code == 200
