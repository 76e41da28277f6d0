"""What FINISH tells of a result it did not write, on a real Valkey with the paced test engine
and no worker process. A cancel that landed after the tick's status read, before FINISH, made
the loop read the job's status once more to learn of it; FINISH's reply now says the end it met
(and drops a result made for no one, as before; a generation's, whose client read its
tokens, keeps what it ran to). A result FINISH failed for its size got a
`succeeded` final, which APPEND turned into `failed` with no error: the final now carries the
failure the record holds."""

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


async def test_a_cancel_before_finish_is_told_by_finish(aredis: aioredis.Redis) -> None:
    """The generation ran to its end unaware of the cancel: FINISH keeps what it ran to on the
    record, which says `cancelled` as the API wrote it (its client read the tokens), and says
    the end it met, so the loop writes a `cancelled` final, with the usage it ran to, reading no
    status after the end."""
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r20-kept")
    CancelBeforeFinish.on(aredis, store, loop)
    tokens = ReadsAfterTheEnd(aredis, KEYS, 60)
    tokens.loop, tokens.late_reads = loop, []
    loop.tokens = tokens
    events = await _run(aredis, "r20-kept", loop)
    record = await _record(store, "r20-kept")
    assert record.status == JobStatus.CANCELLED
    assert "outputs" in record.fields and "write_id" not in record.fields
    [final] = [event for event in events if event.final]
    assert (final.status, final.usage) == (JobStatus.CANCELLED, usage_of(3, 3))
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


async def test_finish_drops_a_result_made_after_its_jobs_cancel(aredis: aioredis.Redis) -> None:
    """Straight through the writer, as a micro-batch's or a Batch API item's write-back: results
    that meet records the API cancelled are not written, say so, and leave the records as the
    cancel wrote them (the error a batch's cancel wrote, its `finished`): no outputs made for no
    one."""
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
    assert "outputs" not in kept.fields and "batch_size" not in failed.fields
    assert failed.fields["error"] == '{"by": "batch"}'
    assert kept.fields["finished"] == ended["r20-ok"]["finished"]
    assert "write_id" not in kept.fields
