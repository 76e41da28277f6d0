"""An ended batch's output and errors files' `bytes`, on a producer run in-process on a real
Valkey, its items' results written by the worker's own write path: the file object OpenAI's SDK
retrieves before each download read every item of the batch to count its size (a 20,000-line
batch: 20,000 Redis commands and most of a second, on every retrieve). It is counted once, at
the first retrieve (a batch that ended before sizes were kept has none stored, and is counted
as ever), and kept in the batch's hash; `bytes` is always the length the content route serves,
non-ASCII text included."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from shared.batch_api_store import file_size_field
from shared.codec import dumps
from shared.job_states import JobStatus
from shared.model_repository import ModelConfig
from tests.conftest import until_async
from tests.test_files_api import KEYS, _key, _producer
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

PARTITION = Partition.of(
    KEYS, ModelConfig(name="identity", kind="batch", backend="identity"), "default"
)
OUTPUTS = {"text": "héllo wörld ✓ 日本語 🙂"}
FAILURE = dumps({"type": "engine_error", "message": "échec ✗ 失敗"}).decode()
LINES = [
    {"custom_id": "ünï-1", "body": {"inputs": {"text": "a ✓"}}},
    {"custom_id": "ünï-2", "body": {"inputs": {"text": "fail ✗"}}},
    {"custom_id": "ünï-3", "body": {"inputs": {"text": "c 日本"}}},
]
# a line that never becomes a job (not JSON), non-ASCII: the errors file quotes it
REFUSED = "{ünïcödé ✗ not json".encode()


async def _run_items(aredis: aioredis.Redis) -> None:
    """Answer the batch's items as a worker does: each succeeds, but the one asked to fail."""
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), "r28-box")
    await reader.ensure_groups()
    [(stream, deliveries)] = await reader.wait([PARTITION.bulk], 10, 100)
    finishes = []
    for delivery in deliveries:
        assert delivery.entry is not None
        if "fail" in json.dumps(delivery.entry.payload):
            finishes.append(PARTITION.finish(delivery, JobStatus.FAILED, {"error": FAILURE}))
        else:
            outputs = dumps(OUTPUTS).decode()
            finishes.append(PARTITION.finish(delivery, JobStatus.SUCCEEDED, {"outputs": outputs}))
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), "r28-box")
    assert len(await writer.finish(stream, finishes)) == len(LINES)
    await writer.close()


@pytest.fixture
async def ended(
    redis_url: str, aredis: aioredis.Redis
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A producer and a batch of theirs that completed: two lines succeeded, one failed, one
    refused at create."""
    async with _producer(redis_url) as client:
        client.headers.update(await _key(aredis, f"r28-{uuid.uuid4().hex[:8]}"))
        body = b"\n".join([*(dumps(line) for line in LINES), REFUSED]) + b"\n"
        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=body,
            headers={"Content-Type": "application/jsonl"},
        )
        assert created.status_code == 202, created.text
        batch_id = created.json()["id"]
        await _run_items(aredis)

        async def completed() -> bool:
            """Its end committed: a read while the producer's sweeper finalizes it (this read
            waits for no other finalizer) says `finalizing`."""
            view = await client.get(f"/v1/batches/{batch_id}")
            return bool(view.json()["status"] == "completed")

        await until_async(completed, timeout=30, every=0.05)
        yield client, batch_id


@pytest.mark.parametrize("kind", ["output", "errors"])
async def test_a_batch_files_size_is_its_contents_length_counted_once(
    ended: tuple[httpx.AsyncClient, str], aredis: aioredis.Redis, kind: str
) -> None:
    client, batch_id = ended
    batch_key, field = KEYS.batch(batch_id), file_size_field(kind)
    assert await aredis.hget(batch_key, field) is None  # as a batch that ended before the change
    content = await client.get(f"/v1/files/{batch_id}-{kind}/content")
    assert content.status_code == 200, content.text
    assert not content.content.isascii()  # the size is in bytes, not characters
    assert len(content.content.splitlines()) == 2  # two succeeded; one failed, one refused
    size = len(content.content)

    first = await client.get(f"/v1/files/{batch_id}-{kind}")
    assert first.status_code == 200, first.text
    assert first.json()["bytes"] == size
    assert await aredis.hget(batch_key, field) == str(size).encode()  # kept: not counted again
    again = await client.get(f"/v1/files/{batch_id}-{kind}")
    assert again.json() == first.json()
    assert len((await client.get(f"/v1/files/{batch_id}-{kind}/content")).content) == size
