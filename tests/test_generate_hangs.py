"""A generate engine that hangs (vLLM's engine core wedged, the process alive, `dead()` false)
ends its loop as a dead one does, once no generation stepped or ended for `queue.max_run_s`:
its loop re-claimed the running entries for as long as the worker lived, so nothing was
reclaimed, new jobs were admitted into the hung engine and their streams never ended. On a
real Valkey with the paced test engine and no worker process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import TERMINAL, JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from workers.engines.base import EngineDied, GenerateRequest, TokenChunk
from workers.engines.vllm_engine import StepStats
from workers.generation.generate_loop import STATUS_POLL_S, GenerateLoop
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader

KEYS = Keys("genhang:")
CONFIG = ModelConfig(
    name="m",
    kind="generate",
    backend="tests.paced_engine:PacedEngine",
    parameters={"step_ms": 3_600_000},  # a step an hour: a wedged engine core
    queue=QueueLimits(visibility_timeout_s=1, max_run_s=0.5),
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
WORKER = "box-8-88"


class SilentStepsEngine(PacedEngine):
    """Decodes SILENT_STEPS steps whose text shows nothing yet (special tokens), a step every
    0.2 s, counted as vLLM's stat logger counts them, then ends with one chunk."""

    async def load(self) -> None:
        await super().load()
        self.step_stats = StepStats()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        for _ in range(SILENT_STEPS):
            await asyncio.sleep(0.2)
            self.step_stats.record(running=1, waiting=0)
        yield TokenChunk(
            "done", finish_reason="stop", prompt_tokens=1, completion_tokens=SILENT_STEPS + 1
        )


SILENT_STEPS = 8  # 1.6 s without a chunk, three times max_run_s


async def _loop(
    aredis: aioredis.Redis, engine: PacedEngine, job_id: str
) -> tuple[GenerateLoop, JobStore]:
    """A generate loop on `engine` (loaded here; its config's `queue.max_run_s` is the
    loop's), with job `job_id` queued."""
    store = JobStore(aredis, KEYS, 60)
    entry = RequestEntry(job_id, {"inputs": {"prompt": "an answer"}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    await engine.load()
    partition = Partition.of(KEYS, engine.config, "default")
    loop = generate_loop(aredis, KEYS, partition, reader, engine)
    return loop, store


async def test_a_hung_engine_hands_its_jobs_back_and_ends_the_loop(
    aredis: aioredis.Redis,
) -> None:
    engine = PacedEngine(CONFIG, "default", "")
    loop, store = await _loop(aredis, engine, "stuck")

    with pytest.raises(EngineDied, match=r"queue\.max_run_s"):
        await asyncio.wait_for(loop.run(), 60)  # a hang guard: it ran on for ever

    [pending] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == WORKER.encode() and pending["times_delivered"] == 1
    record = await store.get("stuck")
    assert record is not None and record.status == JobStatus.RUNNING  # no result: rerun elsewhere
    assert not engine.dead() and not loop.running


async def test_an_engine_that_steps_without_showing_text_is_not_hung(
    aredis: aioredis.Redis,
) -> None:
    """Only chunks counted as life: an engine decoding steps whose text shows nothing yet (vLLM
    skips special tokens; a chunk goes out only with text) was deemed hung after max_run_s,
    the worker exited and the job ran again, and again, until dead-lettered."""
    config = CONFIG.model_copy(update={"parameters": {"step_ms": 200}})
    loop, store = await _loop(aredis, SilentStepsEngine(config, "default", ""), "quiet")
    running = asyncio.create_task(loop.run())

    async def ended() -> str:
        while (record := await store.get("quiet")) is None or record.status not in TERMINAL:
            if running.done():
                return "the loop ended"
            await asyncio.sleep(0.05)
        return str(record.status)

    assert await asyncio.wait_for(ended(), 60) == JobStatus.SUCCEEDED
    loop.stopping.set()
    await asyncio.wait_for(running, 60)  # and the loop ends without EngineDied


class WedgedEngine(PacedEngine):
    """Steps nothing, as a wedged vLLM engine core; an abort ends a generation all the same, as
    `VllmEngine.abort` ends its chunks whatever the engine core does."""

    async def load(self) -> None:
        await super().load()
        self._aborts: dict[str, asyncio.Event] = {}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        await self._aborts.setdefault(request.request_id, asyncio.Event()).wait()
        yield TokenChunk("", 0, "abort", prompt_tokens=1)

    async def abort(self, request_id: str) -> None:
        self._aborts.setdefault(request_id, asyncio.Event()).set()


async def _cancel_each_job_it_runs(loop: GenerateLoop, store: JobStore) -> None:
    """Clients that give up: a job queued, cancelled once running, then the next."""
    for n in range(10_000):
        job_id = f"given-up-{n}"
        entry = RequestEntry(job_id, {"inputs": {"prompt": "an answer"}}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m"})
        while job_id not in loop.running:
            await asyncio.sleep(0.02)
        await store.transition(job_id, JobStatus.CANCELLED)
        await asyncio.sleep(0.2)


async def test_cancels_do_not_keep_a_hung_engine_deemed_alive(
    aredis: aioredis.Redis,
) -> None:
    """A generation our own abort ended (a cancel, seen by the status poll while the engine
    yields nothing) showed no life of the engine: counted as life, clients that gave up on a
    wedged engine, one after another, kept it from ever being deemed hung, and every job the
    loop admitted into it in their place was swallowed."""
    queue = QueueLimits(visibility_timeout_s=1, max_run_s=3)  # longer than a status poll
    engine = WedgedEngine(CONFIG.model_copy(update={"queue": queue}), "default", "")
    loop, store = await _loop(aredis, engine, "stuck")
    clients = asyncio.create_task(_cancel_each_job_it_runs(loop, store))
    try:
        with pytest.raises(EngineDied, match=r"queue\.max_run_s"):
            await asyncio.wait_for(loop.run(), 60)  # a hang guard: it ran on for ever
    finally:
        clients.cancel()


async def test_a_tick_just_short_of_the_status_poll_waits_only_for_what_is_left(
    aredis: aioredis.Redis,
) -> None:
    """The publisher waited a whole STATUS_POLL_S after every tick: one 0.9 s after the last
    poll, too early for the next, put it off to 1.9 s, and a silent job's cancel with it."""
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    loop = generate_loop(aredis, KEYS, PARTITION, reader, PacedEngine(CONFIG, "default", ""))
    assert loop._until_poll() > 0.5 * STATUS_POLL_S  # polled as it was made
    loop._polled_at = time.monotonic() - 0.9 * STATUS_POLL_S
    assert loop._until_poll() <= 0.1 * STATUS_POLL_S
