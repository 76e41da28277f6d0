"""A micro-batch's "batch finished" line counts what its write-back did, on a real Valkey: a
result too large for Redis fails at the write (the engine's outcome said success) and a job
cancelled while it ran is not written; counted from the engine's outcomes, the line read both
as succeeded."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from tests.test_finish_refused_for_size import LIMIT, limited  # noqa: F401 (a fixture)
from workers.batching.micro_batch_telemetry import log_batch
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("batch-log:")
WORKER = "box-7-77"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
STREAM = PARTITION.online


async def test_the_line_counts_a_result_failed_at_the_write_and_one_not_written(
    limited: aioredis.Redis,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = JobStore(limited, KEYS, ttl_s=60)
    outputs = {"huge": f'"{"x" * LIMIT}"', "gone": "1", "fine": "2"}
    for job_id in outputs:
        await store.create(RequestEntry(job_id, {"inputs": {}}, now_ms()), STREAM, {"model": "m"})
    reader = StreamReader(limited, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([STREAM], 10, 100)
    await store.transition("gone", JobStatus.CANCELLED)  # while it ran
    finishes = [
        PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": outputs[d.entry.job_id]})
        for d in deliveries
        if d.entry
    ]
    writer = ResultWriter(limited, KEYS, 60, JobEvents("redis://unused"), WORKER)
    written = await writer.finish(STREAM, finishes)
    await writer.close()

    with caplog.at_level(logging.INFO, logger="workers.batching.micro_batch_telemetry"):
        log_batch("m", deliveries, written)
    [line] = [r for r in caplog.records if r.getMessage() == "batch finished"]
    assert sorted(line.job_ids) == ["fine", "gone", "huge"]  # type: ignore[attr-defined]
    assert (line.failed, line.not_written) == (1, 1)  # type: ignore[attr-defined]
