"""OpenAI's batch create (`POST /v1/batches`, a JSON body naming `input_file_id`) refuses an
`input_file_id` that names no file of the tenant's in OpenAI's shape, naming the field, as its
SDK reads `e.param`: a null one as a missing one (it read "the batch has no lines"), an empty
one as invalid (400, where it was looked up), and one for a file that is not there (unknown,
deleted, a batch's output file) a 404 that names it, where it answered Conveyor's shape. A
producer served in-process over a real Valkey; no worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import dumps, loads
from shared.settings import Settings
from tests.app_client import app_client

LINE = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
CREATE = {"endpoint": "/v1/jobs", "completion_window": "24h"}


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="api-edges-batches")
    async with app_client(create_app(settings)) as client:
        yield client


async def _refusal(producer: httpx.AsyncClient, file_id: Any) -> tuple[int, dict[str, Any]]:
    refused = await producer.post("/v1/batches", json={"input_file_id": file_id, **CREATE})
    return refused.status_code, refused.json()["error"]


async def test_a_null_or_empty_input_file_id_is_openais_400_naming_it(
    producer: httpx.AsyncClient,
) -> None:
    for file_id in (None, ""):
        status, error = await _refusal(producer, file_id)
        assert status == 400, (file_id, error)
        assert (error["type"], error["param"]) == ("invalid_request_error", "input_file_id")
        assert "input_file_id" in error["message"], error


async def test_an_input_file_that_is_not_there_is_openais_404_naming_it(
    producer: httpx.AsyncClient,
) -> None:
    upload = await producer.post(
        "/v1/files", files={"file": ("a.jsonl", LINE)}, data={"purpose": "batch"}
    )
    deleted = upload.json()["id"]
    assert (await producer.delete(f"/v1/files/{deleted}")).json()["deleted"]
    for file_id in (deleted, f"file-{'0' * 32}", f"batch_{'0' * 32}-output"):
        status, error = await _refusal(producer, file_id)
        assert status == 404, (file_id, error)
        assert (error["type"], error["param"]) == ("invalid_request_error", "input_file_id")
        assert file_id in error["message"], error


async def test_a_line_over_the_body_limit_is_refused_alone(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A line is held to CONVEYOR_MAX_BODY_BYTES, as the body of the route it names is: one past
    it became a job no submit could make (a 413 on `POST /v1/jobs`), on a lane of jobs sized to
    that bound. It is refused alone, naming the variable and its custom_id."""
    big = {"custom_id": "big", "body": {"inputs": {"text": "x" * 8192}}}
    source = b'{"custom_id": "small", "body": {"inputs": {"x": 1}}}\n' + dumps(big) + b"\n"
    settings = Settings(redis_url=redis_url, auth="disabled", max_body_bytes=4096)
    async with app_client(create_app(settings)) as client:
        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=source,
            headers={"Content-Type": "application/jsonl"},
        )
        assert created.status_code == 202, created.text
        batch = created.json()
        assert (batch["counts"]["total"], batch["counts"]["invalid"]) == (2, 1), batch
        [refused] = batch["errors"]["data"]
        assert (refused["code"], refused["line"]) == ("payload_too_large", 2), refused
        assert "CONVEYOR_MAX_BODY_BYTES" in refused["message"], refused
        assert (await client.post(f"/v1/batches/{batch['id']}/cancel")).status_code == 200
        errors = await client.get(f"/v1/batches/{batch['id']}/errors")
        lines = [loads(line) for line in errors.content.splitlines()]
        assert [(e["custom_id"], e["status"]) for e in lines] == [
            ("small", "cancelled"),
            ("big", "invalid"),
        ], lines


async def test_an_upload_whose_multipart_does_not_parse_is_openais_400(
    producer: httpx.AsyncClient,
) -> None:
    """`POST /v1/files` is OpenAI's: its multipart body is parsed before any route dependency
    runs, so its refusal answered Conveyor's `http_error`, where the route documents (and
    answers every other invalid upload in) OpenAI's shape."""
    for content_type in ("multipart/form-data; boundary=xyz", "multipart/form-data"):
        refused = await producer.post(
            "/v1/files", content=b"not a form", headers={"Content-Type": content_type}
        )
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", None), error
