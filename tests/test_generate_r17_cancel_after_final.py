"""A cancel (DELETE /v1/jobs/{id}) racing the end of a generation, on a real Valkey with the paced
test engine and no worker process. The worker wrote the final token-stream event before FINISH
wrote the record: a cancel that landed in between won, the record `cancelled` while the stream's
final said `succeeded` with the full text (the record kept no outputs, the job counted in no
state). The final now follows FINISH: a cancel as it is written finds the job ended (409), and
one before FINISH leaves no final that contradicts the record."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis.asyncio as aioredis

from shared.codec import RequestEntry, loads
from shared.job_states import IllegalTransition, JobStatus
from shared.job_store import JobRecord, JobStore, now_ms
from shared.keys import Keys
from shared.token_stream import TokenEvent, usage_of
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from tests.test_tokens_r14_cancel_at_end import CONFIG
from workers.generation.generate_loop import GenerateLoop
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TickWritten, TokenAppend, TokenWriter

KEYS = Keys("r17final:")
PARTITION = Partition.of(KEYS, CONFIG, "default")
PAYLOAD = {"inputs": {"prompt": "one two three"}, "parameters": {"max_tokens": 3}}


class CancelAtTheFinal(TokenWriter):
    """The token writer, before whose write of a final the API cancels the job."""

    store: JobStore
    cancels: list[str]  # what each cancel found: the status that refused it, or `won`

    async def write(self, appends: Sequence[TokenAppend], watch: Sequence[str]) -> TickWritten:
        for append in appends:
            if any(event.final for event in append.events):
                self.cancels.append(await self._cancel(append.job_id))
        return await super().write(appends, watch)

    async def _cancel(self, job_id: str) -> str:
        try:
            await self.store.transition(job_id, JobStatus.CANCELLED)
        except IllegalTransition as refused:
            return str(refused.current)
        return "won"


class CancelBeforeFinish(ResultWriter):
    """The result writer, before whose FINISH the API cancels the jobs."""

    store: JobStore

    @classmethod
    def on(cls, client: aioredis.Redis, store: JobStore, loop: GenerateLoop) -> None:
        """`loop`'s writer made one, cancelling through `store`."""
        writer = cls(client, KEYS, 60, JobEvents("redis://unused"), "box-1")
        writer.store = store
        loop.writer = writer

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        for item in batch:
            await self.store.transition(item.job_id, JobStatus.CANCELLED)
        return await super().finish(stream, batch)


async def _run(aredis: aioredis.Redis, job_id: str, loop: GenerateLoop) -> list[TokenEvent]:
    """Run `job_id` to its end on `loop`; its token stream's events."""
    running = asyncio.create_task(loop.run())
    try:
        async with asyncio.timeout(30):  # a hang guard
            while not await aredis.exists(KEYS.tokens(job_id)) or (loop.running or loop.settling):
                await asyncio.sleep(0.01)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 30)
    return [TokenEvent.decode(*entry) for entry in await aredis.xrange(KEYS.tokens(job_id))]


async def _loop(aredis: aioredis.Redis, store: JobStore, job_id: str) -> GenerateLoop:
    await store.create(RequestEntry(job_id, PAYLOAD, now_ms()), PARTITION.online, {})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-1", mark_on_read=True)
    await reader.ensure_groups()
    engine = PacedEngine(CONFIG, "default", "")
    await engine.load()
    return generate_loop(aredis, KEYS, PARTITION, reader, engine)


async def _record(store: JobStore, job_id: str) -> JobRecord:
    record = await store.get(job_id)
    assert record is not None
    return record


async def test_a_cancel_as_the_final_is_written_finds_the_job_ended(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "done")
    tokens = CancelAtTheFinal(aredis, KEYS, 60)
    tokens.store, tokens.cancels = store, []
    loop.tokens = tokens
    events = await _run(aredis, "done", loop)
    assert tokens.cancels == ["succeeded"]  # as for an ended job: the API's 409
    final = events[-1]
    assert final.final and final.status == JobStatus.SUCCEEDED, final
    record = await _record(store, "done")
    assert record.status == JobStatus.SUCCEEDED
    outputs = loads(record.fields["outputs"])
    assert outputs["usage"] == final.usage == usage_of(3, 3)
    assert outputs["text"] == "".join(event.text for event in events if event.kind == "token")


async def test_a_cancel_before_finish_leaves_no_final_the_record_contradicts(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, 60)
    loop = await _loop(aredis, store, "late")
    CancelBeforeFinish.on(aredis, store, loop)
    events = await _run(aredis, "late", loop)
    record = await _record(store, "late")
    assert record.status == JobStatus.CANCELLED
    assert [event.status for event in events if event.final] == [JobStatus.CANCELLED]
