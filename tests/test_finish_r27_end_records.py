"""What a job's end record says beside what its run streamed or published, on a real Valkey with
the worker's own writer and loops (no worker process). An undecodable entry's reply said its job
was created when the worker read it, while the hash kept its submit's `created`, and its
webhook (in its hash only) was never sent. A generation whose hash expired while it ran was
counted in no finished state (or, gone after its last status read, got no final at all). A
generation a cancel met at FINISH kept no outputs on its record, though its client had read
every token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from tests.test_generate_r17_cancel_after_final import KEYS as GENERATE_KEYS
from tests.test_generate_r17_cancel_after_final import PARTITION as GENERATE_PARTITION
from tests.test_generate_r17_cancel_after_final import CancelBeforeFinish, _loop, _record, _run
from tests.test_tokens_r14_cancel_at_end import CONFIG as GENERATE_CONFIG
from tests.test_tokens_r14_cancel_at_end import _finished
from tests.test_webhook_outbox import _events
from workers.engines.base import GenerateRequest, TokenChunk
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r27-finish:")
WORKER = "box-27-1"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "default")
REPLY = "r27-finish:reply:p1"
HOOK = "http://127.0.0.1:9/hooks/r27"


async def _reply(aredis: aioredis.Redis, writer: ResultWriter, finish: Finish) -> dict[str, Any]:
    """The view the writer's FINISH publishes on REPLY for `finish`, written alone."""
    pubsub = aredis.pubsub()
    try:
        await pubsub.ssubscribe(REPLY)
        assert await writer.finish(PARTITION.online, [finish]) == [finish]
        for _ in range(10):  # the subscription's confirmation, then the reply
            message = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                [view] = loads(message["data"])
                assert isinstance(view, dict)
                return view
    finally:
        await pubsub.aclose()
    raise AssertionError("no reply")


async def undecodable_reply(
    aredis: aioredis.Redis, job_id: str, created_ms: int
) -> tuple[Finish, dict[str, Any]]:
    """A job created at `created_ms` whose entry no worker can read (hand-written): its
    failure, and the reply FINISH publishes for it."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await store.create(RequestEntry(job_id, {}, created_ms), PARTITION.online, {"model": "m"})
    [(entry_id, _)] = await aredis.xrange(PARTITION.online)
    await aredis.xdel(PARTITION.online, entry_id)  # its entry as a hand-written one
    await aredis.xadd(PARTITION.online, {"id": job_id, "payload": b"[1]", "reply": REPLY})
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([PARTITION.online], 10, None)
    finish = PARTITION.skip_or_expire(delivery)
    assert finish is not None
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    try:
        return finish, await _reply(aredis, writer, finish)
    finally:
        await writer.close()


async def test_an_undecodable_entrys_reply_shows_its_hashs_created(
    aredis: aioredis.Redis,
) -> None:
    submitted = now_ms() - 5_000  # submitted well before its worker reads it
    finish, view = await undecodable_reply(aredis, "odd", submitted)
    record = await _record(JobStore(aredis, KEYS, ttl_s=60), "odd")
    created = int(record.fields["created"])
    assert view["status"] == "failed" and view["error"]["type"] == "UndecodableEntry"
    assert view["timings"]["created"] == created / 1000  # was the worker's read, 5 s later
    assert view["timings"]["total_ms"] == int(record.fields["finished"]) - created
    assert finish.view()["timings"] == view["timings"]  # what its webhook event would say


async def test_an_undecodable_entrys_job_with_a_webhook_gets_its_event(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """Its webhook is in its hash only (the entry's payload is unreadable): the failure was
    handed to no one, though the hash said where to send it."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    fields = {"model": "m", "webhook": HOOK}
    await store.create(RequestEntry("odd-hooked", {}, now_ms() - 5_000), PARTITION.online, fields)
    [(entry_id, _)] = await aredis.xrange(PARTITION.online)
    await aredis.xdel(PARTITION.online, entry_id)
    await aredis.xadd(PARTITION.online, {"id": "odd-hooked", "payload": b"[1]"})
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([PARTITION.online], 10, None)
    finish = PARTITION.skip_or_expire(delivery)
    assert finish is not None
    writer = ResultWriter(aredis, KEYS, 60, JobEvents(redis_url), WORKER)
    try:
        assert await writer.finish(PARTITION.online, [finish]) == [finish]
    finally:
        await writer.close()
    created = int((await _record(store, "odd-hooked")).fields["created"])
    [event] = [e for e in await _events(aredis) if e["data"]["id"] == "odd-hooked"]
    assert event["type"] == "job.failed"  # was: no event at all
    assert event["data"]["timings"]["created"] == created / 1000
    assert not await aredis.zscore(KEYS.webhooks_owed(PARTITION.online), "odd-hooked")


class ExpiresMidRun(PacedEngine):
    """The paced engine, whose job's hash expires (its result TTL ran out) after one step."""

    client: aioredis.Redis

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(request):
            if chunk.completion_tokens == 1:
                await self.client.pexpire(GENERATE_KEYS.job(request.request_id), 1)
            yield chunk


async def test_a_generation_whose_hash_expired_counts_once_as_its_final_says(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, GENERATE_KEYS, 60)
    payload = {"inputs": {"prompt": "one two three"}, "parameters": {"max_tokens": 50}}
    await store.create(RequestEntry("r27-gone", payload, now_ms()), GENERATE_PARTITION.online, {})
    reader = StreamReader(aredis, GENERATE_KEYS, GENERATE_PARTITION.streams, "box-27-2")
    await reader.ensure_groups()
    engine = ExpiresMidRun(GENERATE_CONFIG, "default", "")
    engine.client = aredis
    await engine.load()
    counted = {state: _finished(state) for state in ("cancelled", "succeeded", "expired")}
    loop = generate_loop(aredis, GENERATE_KEYS, GENERATE_PARTITION, reader, engine)
    events = await _run(aredis, "r27-gone", loop)
    assert await store.get("r27-gone") is None
    [final] = [event for event in events if event.final]
    assert final.status == JobStatus.CANCELLED  # as the loop reads a job whose hash is gone
    after = {state: _finished(state) - before for state, before in counted.items()}
    assert after == {"cancelled": 1, "succeeded": 0, "expired": 0}  # was counted in none


async def test_a_generation_a_cancel_met_at_finish_keeps_what_it_streamed(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, GENERATE_KEYS, 60)
    loop = await _loop(aredis, store, "r27-raced")
    CancelBeforeFinish.on(aredis, store, loop)
    events = await _run(aredis, "r27-raced", loop)
    record = await _record(store, "r27-raced")
    assert record.status == JobStatus.CANCELLED and "write_id" not in record.fields
    [final] = [event for event in events if event.final]
    streamed = "".join(event.text for event in events if event.kind == "token")
    assert "outputs" in record.fields  # was: none, though its client read every token
    outputs = loads(record.fields["outputs"])
    assert (outputs["text"], outputs["usage"]) == (streamed, final.usage)
    assert record.fields["completion_tokens"] == "3"


class ExpiresBeforeFinish(ResultWriter):
    """The result writer, before whose FINISH the jobs' hashes expire."""

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        for item in batch:
            await self.redis.pexpire(GENERATE_KEYS.job(item.job_id), 1)
        await asyncio.sleep(0.01)
        return await super().finish(stream, batch)


async def test_a_generation_whose_hash_expired_before_finish_gets_its_final(
    aredis: aioredis.Redis,
) -> None:
    """Gone after the tick's last status read: its `succeeded` result was written nowhere and
    it got no final at all, its stream left open to its readers."""
    store = JobStore(aredis, GENERATE_KEYS, 60)
    loop = await _loop(aredis, store, "r27-late-gone")
    loop.writer = ExpiresBeforeFinish(aredis, GENERATE_KEYS, 60, JobEvents("unused"), "box-1")
    cancelled = _finished("cancelled")
    events = await _run(aredis, "r27-late-gone", loop)
    assert await store.get("r27-late-gone") is None
    assert [event.status for event in events if event.final] == [JobStatus.CANCELLED]
    assert _finished("cancelled") - cancelled == 1
