"""What FINISH keeps of a generation, on a real Valkey with the paced test engine and no worker
process. A cancel that landed after the tick's status read, before FINISH, left the `cancelled`
record without what the run reached (FINISH kept that only of a `cancelled` result), and the loop
read the job's status once more to learn of the cancel; FINISH now keeps it and says what it met.
A result FINISH failed for its size got a `succeeded` final, which APPEND turned into `failed`
with no error: the final now carries the failure the record holds."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.token_stream import usage_of
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from tests.test_finish_refused_for_size import LIMIT, limited  # noqa: F401 (a fixture)
from tests.test_generate_r17_cancel_after_final import (
    KEYS,
    PARTITION,
    PAYLOAD,
    CancelBeforeFinish,
    _loop,
    _record,
    _run,
)
from tests.test_generation_r19_cancel_before_finish import ReadsAfterTheEnd
from tests.test_tokens_r14_cancel_at_end import CONFIG
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

WORD = "x" * (LIMIT // 8)  # each token event well within it, eleven of them together over


async def test_a_cancel_before_finish_keeps_what_the_run_reached(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r20-kept")
    CancelBeforeFinish.on(aredis, store, loop)
    tokens = ReadsAfterTheEnd(aredis, KEYS, 60)
    tokens.loop, tokens.late_reads = loop, []
    loop.tokens = tokens
    events = await _run(aredis, "r20-kept", loop)
    record = await _record(store, "r20-kept")
    assert record.status == JobStatus.CANCELLED
    outputs = loads(record.fields["outputs"])
    assert outputs["text"] == "one two three "
    assert outputs["usage"] == usage_of(3, 3)
    assert record.fields["completion_tokens"] == "3"
    assert "write_id" not in record.fields  # no result of this worker's: a rerun replies nothing
    assert [event.status for event in events if event.final] == [JobStatus.CANCELLED]
    assert tokens.late_reads == []  # FINISH's reply said what it met


async def test_a_result_failed_for_its_size_has_a_final_that_says_so(
    limited: aioredis.Redis,  # noqa: F811
) -> None:
    store = JobStore(limited, KEYS, 60)
    payload = {"inputs": {"prompt": WORD}, "parameters": {"max_tokens": 11}}
    await store.create(RequestEntry("r20-huge", payload, now_ms()), PARTITION.online, {})
    reader = StreamReader(limited, KEYS, PARTITION.streams, "box-1", mark_on_read=True)
    await reader.ensure_groups()
    engine = PacedEngine(CONFIG, "default", "")
    await engine.load()
    events = await _run(
        limited, "r20-huge", generate_loop(limited, KEYS, PARTITION, reader, engine)
    )
    record = await _record(store, "r20-huge")
    assert record.status == JobStatus.FAILED
    error = loads(record.fields["error"])
    assert error["type"] == "ResultTooLarge"
    [final] = [event for event in events if event.final]
    assert (final.status, final.error) == (JobStatus.FAILED, error)


async def test_finish_keeps_a_run_of_a_cancelled_job_not_its_end(aredis: aioredis.Redis) -> None:
    """Straight through the writer, as a micro-batch's or a Batch API item's write-back: results
    that meet records the API cancelled are not written, say so, and leave their runs there, not
    their ends (the error a batch's cancel wrote, its `finished`)."""
    store = JobStore(aredis, KEYS, 60)
    for job_id in ("r20-ok", "r20-bad"):
        await store.create(RequestEntry(job_id, PAYLOAD, now_ms()), PARTITION.bulk, {})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-2")
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([PARTITION.bulk], 10, 100)
    ok, bad = (d for d in deliveries if d.entry)
    outputs, failure = '{"text": "done"}', '{"type": "E", "message": "boom"}'
    finishes = [
        PARTITION.finish(ok, JobStatus.SUCCEEDED, {"outputs": outputs, "batch_size": "2"}),
        PARTITION.finish(bad, JobStatus.FAILED, {"error": failure, "batch_size": "2"}),
    ]
    ended = {}
    for job_id, fields in (("r20-ok", {}), ("r20-bad", {"error": '{"by": "batch"}'})):
        ended[job_id] = (await store.transition(job_id, JobStatus.CANCELLED, fields)).fields
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), "box-2")
    assert await writer.finish(PARTITION.bulk, finishes) == []
    await writer.close()
    assert [f.met for f in finishes] == ["cancelled", "cancelled"]
    kept, failed = await _record(store, "r20-ok"), await _record(store, "r20-bad")
    assert (kept.status, failed.status) == (JobStatus.CANCELLED, JobStatus.CANCELLED)
    assert kept.fields["outputs"] == outputs and failed.fields["batch_size"] == "2"
    assert failed.fields["error"] == '{"by": "batch"}'
    assert kept.fields["finished"] == ended["r20-ok"]["finished"]
    assert "write_id" not in kept.fields
