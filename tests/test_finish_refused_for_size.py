"""On a real Valkey: a write-back Redis refuses for its size (a result over `proto-max-bulk-len`:
the server answers a protocol error and closes the connection) read as an outage, retried
forever by the loop's `until_done`, its worker stuck and so each worker that reclaimed the
batch. The result too large fails its job saying why, the rest of the batch is written. A
server out of memory refuses for a while only: that is still an outage, retried."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.redis_backoff import OUTAGE
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("finish-size:")
WORKER = "box-6-66"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
STREAM = PARTITION.online
LIMIT = 1 << 20  # the smallest proto-max-bulk-len Valkey takes


@pytest.fixture
async def limited(aredis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """`aredis`, its server taking values up to LIMIT for the test (the session's server)."""
    before = (await aredis.config_get("proto-max-bulk-len"))["proto-max-bulk-len"]
    await aredis.config_set("proto-max-bulk-len", LIMIT)
    try:
        yield aredis
    finally:
        await aredis.config_set("proto-max-bulk-len", before)


async def _results(client: aioredis.Redis, **outputs: str) -> list[Finish]:
    """Jobs read by WORKER, each succeeded with its `outputs` (JSON text)."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in outputs:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, STREAM, {"model": "m", "variant": "v"})
    reader = StreamReader(client, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([STREAM], 10, 100)
    return [
        PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": outputs[d.entry.job_id]})
        for d in deliveries
        if d.entry
    ]


# Just over, the server answers a protocol error; far over, it closes the connection mid-write.
@pytest.mark.parametrize("size", [LIMIT, 8 * LIMIT], ids=["just-over", "far-over"])
async def test_a_result_over_the_servers_bulk_limit_fails_its_job_and_the_rest_is_written(
    limited: aioredis.Redis, size: int
) -> None:
    finishes = await _results(limited, huge=f'"{"x" * size}"', small='{"y": 1}')
    writer = ResultWriter(limited, KEYS, 60, JobEvents("redis://unused"), WORKER)

    written = await writer.finish(STREAM, finishes)  # raised: a ConnectionError is an outage
    await writer.close()

    assert sorted((f.job_id, f.status) for f in written) == [
        ("huge", "failed"),
        ("small", "succeeded"),
    ]
    store = JobStore(limited, KEYS, ttl_s=60)
    huge, small = await store.get("huge"), await store.get("small")
    assert huge is not None and huge.status == JobStatus.FAILED
    assert loads(huge.fields["error"])["type"] == "ResultTooLarge"
    assert "outputs" not in huge.fields
    assert small is not None and small.status == JobStatus.SUCCEEDED
    assert (await limited.xpending(STREAM, GROUP))["pending"] == 0  # both acknowledged


async def test_a_server_out_of_memory_is_an_outage_retried(aredis: aioredis.Redis) -> None:
    finishes = await _results(aredis, one='{"y": 1}')
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    await aredis.config_set("maxmemory", 1)
    try:
        with pytest.raises(OutOfMemoryError) as refused:
            await writer.finish(STREAM, finishes)
    finally:
        await aredis.config_set("maxmemory", 0)
    assert isinstance(refused.value, OUTAGE)
    assert [f.status for f in await writer.finish(STREAM, finishes)] == ["succeeded"]
    await writer.close()
