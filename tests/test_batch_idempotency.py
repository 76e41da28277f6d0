"""`Idempotency-Key` on `POST /v1/batches`, as on `POST /v1/jobs`: a client whose 202 was lost
retries with the same key and body and gets the first batch back, not a second batch running
every line again; another body with the key is the 409 `/v1/jobs` answers; keys are each
tenant's. A producer run in-process on a real Valkey, under keys of its own, with auth on: no
worker reads its lanes, so every item stays queued."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("batch-idem:")
LINES = "".join(
    json.dumps({"custom_id": f"c{n}", "body": {"inputs": {"n": n}}}) + "\n" for n in range(3)
).encode()
JSONL = {"Content-Type": "application/jsonl"}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    async with app_client(app) as client:
        yield client


async def _key(aredis: aioredis.Redis, tenant: str) -> dict[str, str]:
    spec = KeySpec(tenant=tenant, scopes=frozenset({"submit", "read"}))
    api_key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    return {"Authorization": f"Bearer {api_key}"}


async def _create(
    client: httpx.AsyncClient, auth: dict[str, str], key: str, source: bytes = LINES
) -> httpx.Response:
    headers = {**auth, **JSONL, "Idempotency-Key": key}
    return await client.post(
        "/v1/batches", params={"model": "identity"}, content=source, headers=headers
    )


async def _queued(aredis: aioredis.Redis) -> int:
    return int(await aredis.xlen(KEYS.bulk_queue("identity", "default")))


async def test_a_retry_with_the_key_answers_the_first_batch(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    acme = await _key(aredis, "acme")
    first = await _create(producer, acme, "nightly-7")
    assert first.status_code == 202, first.text
    again = await _create(producer, acme, "nightly-7")
    assert again.status_code == 202, again.text  # the answer its first try had
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["counts"]["total"] == 3
    assert await _queued(aredis) == 3  # its lines enqueued once
    listed = await producer.get("/v1/batches", headers=acme)
    assert [batch["id"] for batch in listed.json()["data"]] == [first.json()["id"]]


async def test_the_key_with_another_body_is_the_conflict_jobs_answer(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    acme = await _key(aredis, "acme")
    assert (await _create(producer, acme, "nightly-8")).status_code == 202
    other = await _create(producer, acme, "nightly-8", LINES.replace(b'"n": 2', b'"n": 9'))

    job = {"model": "identity", "inputs": {"n": 1}}
    headers = {**acme, "Idempotency-Key": "job-8"}
    assert (await producer.post("/v1/jobs", json=job, headers=headers)).status_code == 202
    jobs = await producer.post("/v1/jobs", json={**job, "inputs": {"n": 2}}, headers=headers)
    assert jobs.status_code == 409
    assert other.status_code == 409 and other.json() == jobs.json(), other.text
    assert await _queued(aredis) == 3  # the first batch's lines alone


async def test_a_key_is_its_tenants_own(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    acme, globex = await _key(aredis, "acme"), await _key(aredis, "globex")
    mine = await _create(producer, acme, "shared-key")
    theirs = await _create(producer, globex, "shared-key")
    assert mine.status_code == theirs.status_code == 202, theirs.text
    assert mine.json()["id"] != theirs.json()["id"]
    assert (
        await producer.get(f"/v1/batches/{mine.json()['id']}", headers=globex)
    ).status_code == 404


async def test_a_retry_of_a_batch_made_from_a_file_deleted_since_answers_the_first_batch(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """As a `/v1/jobs` retry answers with its first job when the request would be refused now:
    the input file a batch was made from may be deleted once the batch runs."""
    acme = await _key(aredis, "acme")
    files = {"file": ("lines.jsonl", LINES)}
    uploaded = await producer.post(
        "/v1/files", files=files, data={"purpose": "batch"}, headers=acme
    )
    assert uploaded.status_code == 200, uploaded.text
    body: dict[str, Any] = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/jobs",
        "completion_window": "24h",
        "model": "identity",
    }
    headers = {**acme, "Idempotency-Key": f"file-{uuid.uuid4().hex}"}
    first = await producer.post("/v1/batches", json=body, headers=headers)
    assert first.status_code == 202, first.text
    deleted = await producer.delete(f"/v1/files/{uploaded.json()['id']}", headers=acme)
    assert deleted.status_code == 200, deleted.text

    again = await producer.post("/v1/batches", json=body, headers=headers)
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"], again.text
    fresh = await producer.post("/v1/batches", json=body, headers=acme)
    assert fresh.status_code == 404  # without the key: the file is gone
    assert await _queued(aredis) == 3


async def test_a_create_the_lane_lacks_room_for_is_accepted_once(
    producer: httpx.AsyncClient, aredis: aioredis.Redis
) -> None:
    """A lane with room for one of the batch's three items: the batch is accepted (it was a
    429), the rest held until room frees, and a retry with its key answers the same batch."""
    acme = await _key(aredis, "acme")
    lane = KEYS.bulk_queue("identity", "default")
    async with aredis.pipeline(transaction=False) as pipe:
        for n in range(9_999):  # the lane's default max_length is 10,000
            pipe.xadd(lane, {"n": n})
        await pipe.execute()
    first = await _create(producer, acme, "nightly-9")
    assert first.status_code == 202 and first.json()["counts"]["pending"] == 3, first.text
    again = await _create(producer, acme, "nightly-9")
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"], again.text
    assert await _queued(aredis) == 10_000
