"""A generation its engine failed part-way, after some tokens streamed, whose cancel (DELETE
/v1/jobs/{id}) landed after the generate tick's status read-back and before FINISH: on a real
Valkey with the paced test engine and no worker process. The cancel won, and the stream's final
said `cancelled`, `abort`, with usage, but the failed result sent FINISH no outputs: the record
kept no text, so GET /v1/jobs/{id} (and the OpenAI/SDK views built from it) lost the text the
client had read. It now keeps its text so far ended by `abort`, as a generation cancelled while
it runs does; a failed generation no cancel met is recorded as before (an error, no outputs).
A generation its Batch API batch's expiry stops keeps no text, as OpenAI's expired batch answers
a request in flight at its expiry (`expired`, `batch_expired`, no output)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from shared.batch_api_scripts import BatchStatus
from shared.batch_api_store import ended_early
from shared.codec import loads
from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.token_stream import usage_of
from tests.paced_engine import PacedEngine
from tests.test_generate_r17_cancel_after_final import (
    KEYS,
    CancelBeforeFinish,
    _loop,
    _record,
    _run,
)
from tests.test_generation_r36_cancel_reason import _agree
from tests.test_tokens_r14_cancel_at_end import CONFIG
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_loop import GenerateLoop

FAILURE = "the engine lost the sequence"


class FailsAtTheEnd(PacedEngine):
    """The paced engine, failing each generation in its last step, after the others' tokens."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(request):
            if chunk.finish_reason is not None:
                raise RuntimeError(FAILURE)
            yield chunk


class BatchExpiresMidway(PacedEngine):
    """The paced engine, in whose first step its job's batch expires, as the batch's end settles
    its open items (producer_api/batch_api/progress.py: BatchApiProgress.end)."""

    store: JobStore

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(request):
            if chunk.completion_tokens == 1:
                error = ended_early(BatchStatus.EXPIRED).decode()
                await self.store.settle_many(
                    [request.request_id], JobStatus.EXPIRED, {"error": error}
                )
            yield chunk


async def _failing_loop(aredis: aioredis.Redis, store: JobStore, job_id: str) -> GenerateLoop:
    loop = await _loop(aredis, store, job_id)
    engine = FailsAtTheEnd(CONFIG, "default", "")
    await engine.load()
    loop.engine = engine
    return loop


async def test_a_failed_generation_a_cancel_met_keeps_its_text_so_far(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _failing_loop(aredis, store, "r37-failed-cancelled")
    CancelBeforeFinish.on(aredis, store, loop)
    events = await _run(aredis, "r37-failed-cancelled", loop)
    await _agree(store, "r37-failed-cancelled", events)  # its text, `abort`, its usage
    view = (await _record(store, "r37-failed-cancelled")).view()
    assert view["outputs"] == {
        "text": "one two ",
        "finish_reason": "abort",
        "usage": usage_of(3, 2),
    }
    assert "error" not in view  # cancelled, as its final says: the failure was not its end


async def test_a_failed_generation_no_cancel_met_is_recorded_as_before(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _failing_loop(aredis, store, "r37-failed")
    events = await _run(aredis, "r37-failed", loop)
    final = events[-1]
    assert final.final and final.status == JobStatus.FAILED, final
    record = await _record(store, "r37-failed")
    assert record.status == JobStatus.FAILED
    assert record.view()["error"] == {"type": "RuntimeError", "message": FAILURE}
    # no outputs, nor the text so far a failed result brings FINISH for a cancel it may meet
    assert [name for name in record.fields if name.startswith("outputs")] == []


async def test_a_generation_its_batch_expiry_stops_keeps_no_text(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "r37-expired")
    engine = BatchExpiresMidway(CONFIG, "default", "")
    engine.store = store
    await engine.load()
    loop.engine = engine
    events = await _run(aredis, "r37-expired", loop)
    assert [event.status for event in events if event.final] == [JobStatus.EXPIRED]
    assert "one " in [event.text for event in events if event.kind == "token"]  # it had begun
    view = (await _record(store, "r37-expired")).view()
    assert view["status"] == JobStatus.EXPIRED and "outputs" not in view
    assert view["error"] == loads(ended_early(BatchStatus.EXPIRED))  # the batch's, as it wrote it
