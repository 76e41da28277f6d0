"""On a real Valkey: a result under `proto-max-bulk-len` but over `client-query-buffer-limit`
(a server whose query buffer is set below its bulk limit) is refused as one over the bulk limit is
(the connection closed, read as an outage), so the write-back must fail it saying why instead
of retrying the batch for ever. With `CONVEYOR_REPLICA_ACKS` the replies go out after the
write, one message per producer: each result within the limit, all of one producer's together
over it, the message was refused at every retry of the write-back, its results written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from conveyor.embedded_valkey import start_embedded_valkey
from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("writeback-query-buffer:")
WORKER = "box-7-77"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
STREAM = PARTITION.online
QUERY_LIMIT = "client-query-buffer-limit"
LIMIT = 1 << 20  # the smallest client-query-buffer-limit Valkey takes


@pytest.fixture
async def limited(aredis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """`aredis`, its server taking commands of up to LIMIT bytes read at once for the test (the
    session's server: restored after)."""
    before = (await aredis.config_get(QUERY_LIMIT))[QUERY_LIMIT]
    await aredis.config_set(QUERY_LIMIT, LIMIT)
    try:
        yield aredis
    finally:
        await aredis.config_set(QUERY_LIMIT, before)


async def _results(client: aioredis.Redis, outputs: dict[str, str]) -> list[Finish]:
    """Jobs read by WORKER, each succeeded with its `outputs` (JSON text)."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in outputs:
        await store.create(RequestEntry(job_id, {"inputs": {}}, now_ms()), STREAM, {})
    reader = StreamReader(client, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([STREAM], len(outputs), 100)
    return [
        PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": outputs[d.entry.job_id]})
        for d in deliveries
        if d.entry
    ]


def _sized(item: Finish, size: int) -> Finish:
    """`item`, its outputs padded so that its largest value sent (its reply, which embeds them)
    is `size` bytes."""
    padding = size - len(item.message())
    outputs = item.fields["outputs"]
    return replace(
        item, fields={**item.fields, "outputs": outputs[:1] + "x" * padding + outputs[1:]}
    )


async def _written(client: aioredis.Redis, finishes: list[Finish]) -> dict[str, str]:
    """Each job's status after one write-back of its result (an outage raised)."""
    writer = ResultWriter(client, KEYS, 60, JobEvents("redis://unused"), WORKER)
    written = await writer.finish(STREAM, finishes)
    await writer.close()
    assert (await client.xpending(STREAM, GROUP))["pending"] == 0  # all acknowledged
    return {f.job_id: f.status for f in written}


# the query buffer holds a value with its CRLF: one of LIMIT - 1 bytes is already over
@pytest.mark.parametrize("size", [LIMIT - 1, 2 * LIMIT], ids=["just-over", "far-over"])
async def test_a_result_over_the_query_buffer_limit_fails_its_job_and_the_rest_is_written(
    limited: aioredis.Redis, size: int
) -> None:
    huge, small = await _results(limited, {"huge": '"x"', "small": '{"y": 1}'})

    written = await _written(limited, [_sized(huge, size), small])

    assert written == {"huge": "failed", "small": "succeeded"}

    record = await JobStore(limited, KEYS, ttl_s=60).get("huge")
    assert record is not None and record.status == JobStatus.FAILED
    assert loads(record.fields["error"])["type"] == "ResultTooLarge"
    assert "outputs" not in record.fields


@pytest.fixture
def replicated(settings_env: Callable[..., None]) -> Iterator[str]:
    """The URL of a server of the test's own, with one replica whose confirmation each write
    waits for (`CONVEYOR_REPLICA_ACKS`), taking commands of up to LIMIT bytes read at once."""
    settings_env(CONVEYOR_REPLICA_ACKS="1")
    master = start_embedded_valkey(config={QUERY_LIMIT: LIMIT, "repl-diskless-sync-delay": 0})
    try:
        replica = start_embedded_valkey(config={"replicaof": f"127.0.0.1 {master.port}"})
        try:
            yield master.connection_url
        finally:
            replica.stop()
    finally:
        master.stop()


async def _replica_online(client: aioredis.Redis) -> None:
    while (await client.info("replication")).get("slave0", {}).get("state") != "online":
        await asyncio.sleep(0.05)


async def test_a_producers_replies_over_the_limit_together_all_reach_it(replicated: str) -> None:
    client = aioredis.Redis.from_url(replicated)
    pubsub = client.pubsub()
    try:
        await _replica_online(client)
        await pubsub.ssubscribe("producer-1")
        finishes = await _results(client, {f"job-{i}": '"x"' for i in range(3)})
        finishes = [replace(_sized(item, LIMIT // 2), reply="producer-1") for item in finishes]

        assert await _written(client, finishes) == dict.fromkeys(
            ["job-0", "job-1", "job-2"], "succeeded"
        )

        replied: list[str] = []
        for _ in range(10):  # the subscription's confirmation, then the replies (two messages)
            message = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=1)
            replied += [view["id"] for view in loads(message["data"])] if message else []
            if len(replied) == 3:
                break
        assert sorted(replied) == ["job-0", "job-1", "job-2"]
    finally:
        await pubsub.aclose()
        await client.aclose()
