"""Edges of the continuous-batching loop on a real Valkey with the paced test engine and no
worker process: text no token stream can store, a drain through a Redis blip, and the count of
a generation its Batch API batch's window ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.codec import RequestEntry, loads
from shared.job_states import TERMINAL, JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.token_stream import TokenEvent
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_loop import GenerateLoop
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TickWritten, TokenAppend, TokenWriter

KEYS = Keys("genedge:")
CONFIG = ModelConfig(
    name="m",
    kind="generate",
    backend="tests.paced_engine:PacedEngine",
    parameters={"step_ms": 5},
    max_num_seqs=4,
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
LONE_SURROGATE = "\udcff"  # what `bytes.decode(errors="surrogateescape")` makes of a stray byte


class SurrogateEngine(PacedEngine):
    """The paced engine, whose prompt word <stray> comes out as a lone surrogate: a str, but
    none that UTF-8 (Redis, JSON) can hold; at the word <raise> it raises, saying one."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for chunk in super().generate(request):
            if chunk.text == "<raise> ":
                raise ValueError(f"cannot decode {LONE_SURROGATE}")
            if chunk.text == "<stray> ":
                chunk.text = LONE_SURROGATE
            yield chunk


async def _run(
    aredis: aioredis.Redis, engine: PacedEngine, prompts: dict[str, str], max_tokens: int = 3
) -> tuple[GenerateLoop, JobStore, asyncio.Task[None]]:
    """A loop on `engine` (loaded here) serving one job per prompt, started."""
    store = JobStore(aredis, KEYS, 60)
    for job_id, prompt in prompts.items():
        payload = {"inputs": {"prompt": prompt}, "parameters": {"max_tokens": max_tokens}}
        await store.create(RequestEntry(job_id, payload, now_ms()), PARTITION.online, {})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-1", mark_on_read=True)
    await reader.ensure_groups()
    await engine.load()
    loop = generate_loop(aredis, KEYS, PARTITION, reader, engine)
    return loop, store, asyncio.create_task(loop.run())


async def _ended(store: JobStore, job_id: str, running: asyncio.Task[None]) -> dict[str, str]:
    """The job's hash once it ended; raises if the loop ended first."""
    while (record := await store.get(job_id)) is None or record.status not in TERMINAL:
        if running.done():
            running.result()
            raise AssertionError("the loop ended with the job unfinished")
        await asyncio.sleep(0.01)
    return record.fields


async def _events(aredis: aioredis.Redis, job_id: str) -> list[TokenEvent]:
    entries = await aredis.xrange(KEYS.tokens(job_id))
    return [TokenEvent.decode(entry_id, raw) for entry_id, raw in entries]


async def _both_ended(
    aredis: aioredis.Redis, prompts: dict[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The hashes of the two jobs `prompts` names, once both ended, the loop then stopped."""
    loop, store, running = await _run(aredis, SurrogateEngine(CONFIG, "default", ""), prompts)
    first, second = prompts
    try:
        async with asyncio.timeout(30):  # a hang guard
            return await _ended(store, first, running), await _ended(store, second, running)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 30)


async def test_text_utf8_cannot_hold_fails_its_own_job_only(aredis: aioredis.Redis) -> None:
    """A chunk of text with a lone surrogate passed `checked` (it is a str), then failed to
    encode in the tick's write, which ended the loop writing every job's tokens: the worker's
    consumer stopped, the other running jobs with it."""
    stray, fine = await _both_ended(aredis, {"stray": "a <stray> word", "fine": "plain words here"})
    assert stray["status"] == JobStatus.FAILED
    assert loads(stray["error"])["type"] == "InvalidOutput"
    assert fine["status"] == JobStatus.SUCCEEDED
    assert loads(fine["outputs"])["text"] == "plain words here "
    [final] = [event for event in await _events(aredis, "stray") if event.final]
    assert final.status == JobStatus.FAILED


async def test_an_engine_error_utf8_cannot_hold_fails_its_own_job_only(
    aredis: aioredis.Redis,
) -> None:
    """An engine's error saying a lone surrogate failed the JSON of its job's final event,
    which ended the loop writing every job's tokens; the message now says it escaped."""
    prompts = {"raising": "a <raise> word", "fine": "plain words here"}
    raising, fine = await _both_ended(aredis, prompts)
    error = {"type": "ValueError", "message": "cannot decode \\udcff"}
    assert raising["status"] == JobStatus.FAILED and loads(raising["error"]) == error
    assert fine["status"] == JobStatus.SUCCEEDED
    [final] = [event for event in await _events(aredis, "raising") if event.final]
    assert final.error == error


class BlipAtStop(TokenWriter):
    """A writer whose first write once `stopping` is set meets an outage (a Redis failover
    during a rolling restart), Redis answering again by the retry."""

    def __init__(self, client: aioredis.Redis, stopping: asyncio.Event) -> None:
        super().__init__(client, KEYS, 60)
        self.stopping = stopping
        self.failed = False

    async def write(self, appends: Sequence[TokenAppend], watch: Sequence[str]) -> TickWritten:
        if self.stopping.is_set() and not self.failed:
            self.failed = True
            raise RedisConnectionError("Error 111 connecting to Redis. Connection refused.")
        return await super().write(appends, watch)


async def test_a_drain_writes_its_generations_through_a_redis_blip(
    aredis: aioredis.Redis,
) -> None:
    """The drain gives generations `drain_s` to finish, and touches their entries through an
    outage; the loop writing their tokens and results stopped at its first failed write once
    the drain began: a generation that finished in time was never written, left to rerun
    elsewhere a whole visibility timeout later."""
    engine = PacedEngine(CONFIG.model_copy(update={"parameters": {"step_ms": 50}}), "default", "")
    loop, store, running = await _run(aredis, engine, {"draining": "one two three"}, 4)
    loop.drain_s = 30  # time enough to finish, however loaded the machine
    writer = loop.tokens = BlipAtStop(aredis, loop.stopping)
    async with asyncio.timeout(30):  # a hang guard
        while not await aredis.exists(KEYS.tokens("draining")):
            await asyncio.sleep(0.01)
        loop.stopping.set()
        await running
    assert writer.failed
    record = await store.get("draining")
    assert record is not None and record.status == JobStatus.SUCCEEDED
    events = await _events(aredis, "draining")
    assert events[-1].final and events[-1].usage["completion_tokens"] == 4
    assert "".join(event.text for event in events) == "one two three one "


def _finished(state: str) -> float:
    labels = {"model": "m", "variant": "default", "state": state}
    return REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0


async def test_a_generation_its_batch_expired_counts_as_expired(aredis: aioredis.Redis) -> None:
    """A Batch API batch whose window ends expires its running items as a cancel ends them
    (the API counts only the queued ones it withdraws); the loop counted the cancelled ones it
    aborted, but not the expired: `conveyor_jobs_finished` missed every one."""
    engine = PacedEngine(CONFIG.model_copy(update={"parameters": {"step_ms": 20}}), "default", "")
    loop, store, running = await _run(aredis, engine, {"item": "one two three"}, 500)
    before = _finished("expired")
    try:
        async with asyncio.timeout(30):  # a hang guard
            while not await aredis.exists(KEYS.tokens("item")):
                await asyncio.sleep(0.01)
            await store.transition("item", JobStatus.EXPIRED)
            while loop.running:
                await asyncio.sleep(0.01)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 30)
    assert _finished("expired") == before + 1
    events = await _events(aredis, "item")
    assert events[-1].final and events[-1].status == JobStatus.EXPIRED
