"""A cancel (DELETE /v1/jobs/{id}) that lands in the engine step that ends the generation, on a
real Valkey with the paced test engine and no worker process. The tick that wrote the last
text also wrote a `succeeded` final without reading the job's status (an ending job is not
watched), so the stream's final contradicted the `cancelled` record: readers fell back to the
record (no usage), FINISH refused the `succeeded` result and the job counted in no state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.token_stream import TokenEvent, usage_of
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from workers.engines.base import GenerateRequest, TokenChunk
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("r14cancel:")
CONFIG = ModelConfig(
    name="m",
    kind="generate",
    backend="tests.paced_engine:PacedEngine",
    parameters={"step_ms": 5},
    max_num_seqs=2,
)
PARTITION = Partition.of(KEYS, CONFIG, "default")


class CancelledAtTheEnd(PacedEngine):
    """The paced engine, whose job the API cancels just before the step that ends it."""

    store: JobStore

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(request):
            if chunk.finish_reason is not None:
                await self.store.transition(request.request_id, JobStatus.CANCELLED)
            yield chunk


def _finished(state: str) -> float:
    labels = {"model": "m", "variant": "default", "state": state}
    return REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0


async def test_a_cancel_in_the_last_step_ends_stream_and_record_alike(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    payload = {"inputs": {"prompt": "one two three"}, "parameters": {"max_tokens": 3}}
    await store.create(RequestEntry("late", payload, now_ms()), PARTITION.online, {})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-1", mark_on_read=True)
    await reader.ensure_groups()
    engine = CancelledAtTheEnd(CONFIG, "default", "")
    engine.store = store
    await engine.load()
    loop = generate_loop(aredis, KEYS, PARTITION, reader, engine)
    before = _finished("cancelled")
    running = asyncio.create_task(loop.run())
    try:
        async with asyncio.timeout(30):  # a hang guard
            while not await aredis.exists(KEYS.tokens("late")) or (loop.running or loop.settling):
                await asyncio.sleep(0.01)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 30)
    entries = await aredis.xrange(KEYS.tokens("late"))
    final = TokenEvent.decode(*entries[-1])
    assert final.final and final.status == JobStatus.CANCELLED, final
    assert final.usage == usage_of(3, 3) and final.error is None
    record = await store.get("late")
    assert record is not None and record.status == JobStatus.CANCELLED
    outputs = loads(record.fields["outputs"])  # what it ran to joins the record
    assert outputs["usage"] == final.usage and outputs["finish_reason"] == final.finish_reason
    assert _finished("cancelled") == before + 1


async def test_a_final_resent_after_its_reply_was_lost_reports_the_cancel_again(
    aredis: aioredis.Redis,
) -> None:
    """The write of a final the job's cancel rewrote, resent (its reply lost), appends nothing
    twice and still tells the loop the status the record holds."""
    store = JobStore(aredis, KEYS, 60)
    await store.create(RequestEntry("resent", {}, now_ms()), PARTITION.online, {})
    await store.transition("resent", JobStatus.CANCELLED)
    writer = TokenWriter(aredis, KEYS, 60)
    final = TokenEvent("final", status="failed", finish_reason="stop", usage=usage_of(1, 1))
    final.error = {"type": "Boom", "message": "the engine failed"}
    append = TokenAppend("resent", "run-a", 1, [TokenEvent("token", "A", 1), final], True)
    for _ in range(2):
        written = await writer.write([append], [])
        assert written.refused == [] and written.statuses == {"resent": "cancelled"}
    events = [TokenEvent.decode(*entry) for entry in await aredis.xrange(KEYS.tokens("resent"))]
    assert [event.kind for event in events] == ["token", "final"]
    assert events[-1].status == "cancelled" and events[-1].error is None
    assert events[-1].usage == usage_of(1, 1)
