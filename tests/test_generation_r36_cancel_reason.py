"""Why a cancelled generation ended, as its record and its token stream's final tell it, on a real
Valkey with the paced test engine and no worker process. A cancel (DELETE /v1/jobs/{id}) between
a generate tick's status read-back and FINISH won, and the final said `abort`, but FINISH joined
the run's outputs to the `cancelled` record as the engine ended them (`length`): GET
/v1/jobs/{id} and the OpenAI/SDK views built from the record said otherwise. Both now say
`abort`, as vLLM reports an aborted request, whether the loop saw the cancel or not."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.token_stream import TokenEvent, final_from_job, usage_of
from tests.test_generate_r17_cancel_after_final import (
    KEYS,
    PARTITION,
    PAYLOAD,
    CancelBeforeFinish,
    _loop,
    _record,
    _run,
)
from tests.test_tokens_r14_cancel_at_end import CONFIG, CancelledAtTheEnd
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader


async def _agree(store: JobStore, job_id: str, events: list[TokenEvent]) -> None:
    """The record, as the API reads it, says what the stream's final says: cancelled, `abort`,
    with the text and usage its client read."""
    final = events[-1]
    assert final.final and final.status == JobStatus.CANCELLED, final
    record = await _record(store, job_id)
    outputs = record.view()["outputs"]
    assert record.status == JobStatus.CANCELLED
    assert outputs["finish_reason"] == final.finish_reason == "abort", outputs
    assert outputs["usage"] == final.usage
    assert outputs["text"] == "".join(event.text for event in events if event.kind == "token")
    assert final_from_job(record, None).finish_reason == "abort"  # a reader whose stream is gone


async def test_a_cancel_before_finish_leaves_the_record_saying_abort(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r36-raced")
    CancelBeforeFinish.on(aredis, store, loop)
    await _agree(store, "r36-raced", await _run(aredis, "r36-raced", loop))


async def test_a_cancel_the_loop_sees_leaves_the_record_saying_abort(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r36-seen")
    engine = CancelledAtTheEnd(CONFIG, "default", "")
    engine.store = store
    await engine.load()
    loop.engine = engine
    await _agree(store, "r36-seen", await _run(aredis, "r36-seen", loop))


async def test_finish_keeps_the_text_of_the_outputs_it_ends_by_abort(
    aredis: aioredis.Redis,
) -> None:
    """Straight through the writer: FINISH rewrites only the finish_reason of the outputs it
    joins to the cancelled record: its text, which JSON escapes (quotes, a control character)
    or holds as it is (`/`, non-ASCII), reads back as the run wrote it."""
    store = JobStore(aredis, KEYS, 60)
    await store.create(RequestEntry("r36-text", PAYLOAD, now_ms()), PARTITION.online, {})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-3")
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([PARTITION.online], 10, 100)
    ran = {"text": 'a "b" c/d\te\u0001 é 😀', "finish_reason": "stop", "usage": usage_of(2, 9)}
    finish = PARTITION.finish(delivery, JobStatus.SUCCEEDED, {"outputs": dumps(ran).decode()})
    finish.streamed = True
    await store.transition("r36-text", JobStatus.CANCELLED)
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), "box-3")
    await writer.finish(PARTITION.online, [finish])
    await writer.close()
    assert finish.met == JobStatus.CANCELLED
    outputs = (await _record(store, "r36-text")).view()["outputs"]
    assert outputs == ran | {"finish_reason": "abort"}
