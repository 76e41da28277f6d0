"""A worker cut off from Redis past the visibility timeout writes back late, after another took
its entry over: its write must leave the job, its attempt history and the entry to the new
owner. Script-level, on a bare Valkey with made-up consumers (tests/test_attempts.py's)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.codec import dumps
from shared.job_states import JobStatus
from shared.keys import GROUP
from tests.test_attempts import KEYS, PARTITION, STREAM, _taken_over
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery


async def _write_back(
    client: aioredis.Redis, consumer: str, ran: Delivery, status: JobStatus, text: str
) -> None:
    """`consumer`'s write-back of its run of a generation the API cancelled meanwhile: nothing
    is reported written (a `cancelled` record only joins the cancel's)."""
    writer = ResultWriter(client, KEYS, 60, JobEvents("redis://unused"), consumer)
    outputs = {"outputs": dumps({"text": text, "finish_reason": "abort"}).decode()}
    try:
        assert await writer.finish(STREAM, [PARTITION.finish(ran, status, outputs)]) == []
    finally:
        await writer.close()


@pytest.mark.parametrize("late", [JobStatus.CANCELLED, JobStatus.SUCCEEDED])
async def test_a_late_write_back_of_a_job_cancelled_under_its_new_owner_leaves_it_to_that_owner(
    aredis: aioredis.Redis, late: JobStatus
) -> None:
    """hA-1's generation was taken over by hB-2, then cancelled (hB-2's attempt ends
    `cancelled`); hA-1, back, wrote its own run back: its cancelled record overwrote the job's
    `started` and `attempts` with its older delivery's (the job's timings then began before the
    crashed attempt's end) and put its stale text on record, and either write-back acknowledged
    the entry hB-2 held, whose touch then gave hB-2's run up unwritten. The late write-back
    writes nothing and leaves the entry to hB-2, whose record is the job's."""
    job_id = f"cut-off-{late}"
    store, stale, rescued = await _taken_over(aredis, job_id)
    await store.transition(job_id, JobStatus.CANCELLED)

    await _write_back(aredis, "hA-1", stale, late, "stale")
    record = await store.get(job_id)
    assert record is not None and "outputs" not in record.fields
    assert (record.fields["started"], record.fields["attempts"]) == (str(rescued.claimed_ms), "2")
    pending = await aredis.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert [(row["message_id"], row["consumer"]) for row in pending] == [(stale.entry_id, b"hB-2")]

    await _write_back(aredis, "hB-2", rescued, JobStatus.CANCELLED, "fresh")
    record = await store.get(job_id)
    assert record is not None
    view = record.view(history=True)
    assert view["outputs"]["text"] == "fresh" and view["attempts"] == 2
    runs = view["attempt_history"]
    assert [(run["consumer"], run["outcome"]) for run in runs] == [
        ("hA-1", "crashed"),
        ("hB-2", "cancelled"),
    ]
    assert runs[0]["ended"] == runs[1]["started"] == view["timings"]["started"]
    assert await aredis.xlen(STREAM) == 0
