"""A batch's output or errors file id that its view does not name (no line in it: a batch with
no succeeded line, one refused whole at create, one with no failed line) answers 404 on the
Files API, in OpenAI's shape, as OpenAI's answers a file id that does not exist: it answered
200 with an empty file (and a file object of 0 bytes). The ids the view names are served as
before, and the batch's own `/v1/batches/{id}/output|errors` routes still serve an empty file.
On a producer run in-process on a real Valkey, the items' results written by the worker's own
write path."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from shared.job_states import JobStatus
from tests.conftest import until_async
from tests.test_batch_r28_file_size import PARTITION
from tests.test_files_api import FILE, KEYS, _key, _producer
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

JSONL = {"Content-Type": "application/jsonl"}


def _absent(batch_id: str, kind: str) -> dict[str, Any]:
    """OpenAI's 404 body for a batch's file its view does not name (`param` the file id)."""
    message = f"file {batch_id}-{kind} not found: batch {batch_id} has no {kind} line"
    error = {"message": message, "type": "invalid_request_error", "param": "id", "code": None}
    return {"error": error}


async def _assert_absent(client: httpx.AsyncClient, batch_id: str, kind: str) -> None:
    """Retrieve, content and delete of the file alike."""
    file_id = f"{batch_id}-{kind}"
    for method, path in [
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"),
    ]:
        got = await client.request(method, path)
        assert (got.status_code, got.json()) == (404, _absent(batch_id, kind)), (method, path)


async def _succeed_waiting(aredis: aioredis.Redis) -> None:
    """Answer the items waiting in the identity bulk lane as a worker does: succeeded (an
    earlier test's left there are answered too)."""
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), "r38-box")
    await reader.ensure_groups()
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), "r38-box")
    for stream, deliveries in await reader.wait([PARTITION.bulk], 100, 100):
        finishes = [
            PARTITION.finish(delivery, JobStatus.SUCCEEDED, {"outputs": '{"ok": true}'})
            for delivery in deliveries
        ]
        await writer.finish(stream, finishes)
    await writer.close()


def _sdk(client: httpx.AsyncClient) -> AsyncOpenAI:
    api_key = str(client.headers["Authorization"]).removeprefix("Bearer ")
    return AsyncOpenAI(
        base_url="http://test/v1", api_key=api_key, http_client=client, max_retries=0
    )


async def test_a_batch_refused_whole_has_no_output_file(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Every line refused at create: failed at once, its errors file named and served, its
    output file not there."""
    async with _producer(redis_url) as client:
        client.headers.update(await _key(aredis, f"r38-{uuid.uuid4().hex[:8]}"))
        created = await client.post(
            "/v1/batches", params={"model": "identity"}, content=b"not json\n", headers=JSONL
        )
        assert created.status_code == 202, created.text
        batch = created.json()
        batch_id = batch["id"]
        assert batch["status"] == "failed" and batch["output_file_id"] is None, batch
        assert batch["error_file_id"] == f"{batch_id}-errors", batch

        await _assert_absent(client, batch_id, "output")
        with pytest.raises(openai.NotFoundError):  # OpenAI's SDK reads it as OpenAI's 404
            await _sdk(client).files.content(f"{batch_id}-output")
        errors = await client.get(f"/v1/files/{batch_id}-errors/content")
        assert errors.status_code == 200 and errors.content.count(b"\n") == 1, errors.text
        own = await client.get(f"/v1/batches/{batch_id}/output")  # Conveyor's route: as it was
        assert (own.status_code, own.content) == (200, b"")


async def test_a_batch_with_no_failed_line_has_no_errors_file(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Every line succeeded: its output file named and served, its errors file not there."""
    async with _producer(redis_url) as client:
        client.headers.update(await _key(aredis, f"r38-{uuid.uuid4().hex[:8]}"))
        created = await client.post(
            "/v1/batches", params={"model": "identity"}, content=FILE, headers=JSONL
        )
        assert created.status_code == 202, created.text
        batch_id = created.json()["id"]

        async def ended() -> dict[str, Any] | None:
            await _succeed_waiting(aredis)
            view: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
            return view if view["status"] == "completed" else None

        batch = await until_async(ended, timeout=30, every=0.05)
        assert batch["error_file_id"] is None, batch
        assert batch["output_file_id"] == f"{batch_id}-output", batch

        await _assert_absent(client, batch_id, "errors")
        output = await _sdk(client).files.retrieve(f"{batch_id}-output")
        content = await client.get(f"/v1/files/{batch_id}-output/content")
        assert content.status_code == 200 and len(content.content) == output.bytes > 0
        own = await client.get(f"/v1/batches/{batch_id}/errors")  # Conveyor's route: as it was
        assert (own.status_code, own.content) == (200, b"")
