"""A generate loop's drain at a stop (SIGTERM), on a real Valkey with the paced test engine and
no worker process: it touches its running entries as the admit loop did (it touched none, and
a drain longer than two thirds of the visibility timeout let another worker's reclaimer take
over generations still running here and run the jobs twice), and a generation whose abort the
engine ignores (hung, not yet deemed so) holds it no longer than a bounded wait (it waited for
ever, past the grace that the engine's close needs)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.redis_client import connect
from tests.lane_rig import generate_loop, until_blocked_in_read
from tests.paced_engine import PacedEngine
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("gendrain:")
WORKER = "box-7-77"  # the worker asked to stop
TAKER = "box-8-88"  # another worker of the partition, reclaiming meanwhile
STEPS = 18  # tokens of the drained generation, a step each


def _partition(step_ms: int, max_num_seqs: int = 16) -> Partition:
    """Partition `m:default` on the paced engine, a step every `step_ms`; its entries are
    abandoned after a second without a touch."""
    config = ModelConfig(
        name="m",
        kind="generate",
        backend="tests.paced_engine:PacedEngine",
        parameters={"step_ms": step_ms},
        queue=QueueLimits(visibility_timeout_s=1),
        max_num_seqs=max_num_seqs,
    )
    return Partition.of(KEYS, config, "default")


async def _stopped_while_generating(
    aredis: aioredis.Redis, partition: Partition, job_id: str, drain_s: float, block_ms: int = 50
) -> asyncio.Task[None]:
    """A loop of WORKER that started generating job `job_id` and was then asked to stop."""
    entry = RequestEntry(
        job_id, {"inputs": {"prompt": "a"}, "parameters": {"max_tokens": STEPS}}, now_ms()
    )
    await JobStore(aredis, KEYS, 60).create(entry, partition.online, {"model": "m"})
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    engine = PacedEngine(partition.config, "default", "")
    await engine.load()
    loop = generate_loop(aredis, KEYS, partition, reader, engine, drain_s, block_ms)
    running = asyncio.create_task(loop.run())

    async def started() -> None:
        while job_id not in loop.running:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(started(), 30)
    loop.stopping.set()
    return running


async def test_a_draining_loop_touches_its_generations_so_none_is_reclaimed(
    aredis: aioredis.Redis,
) -> None:
    """A generation of ~1.8 s drained under a 1 s visibility timeout: another worker's reclaimer
    took it over, recorded a false `crashed` attempt and ran it again, and the draining run,
    nearly done, was given up. The drain is generous: a slow machine must not abandon it."""
    partition = _partition(step_ms=100)
    running = await _stopped_while_generating(aredis, partition, "drained", drain_s=10)
    taker = Reclaimer(aredis, KEYS, partition, TAKER, 60, JobEvents("redis://unused"))
    claimed = []
    while not running.done():
        claimed += await taker.reclaim(partition.online)
        await asyncio.sleep(0.05)
    await running

    assert claimed == []
    record = await JobStore(aredis, KEYS, 60).get("drained")
    assert record is not None and record.status == JobStatus.SUCCEEDED
    outcomes = [run["outcome"] for run in record.view(history=True)["attempt_history"]]
    assert outcomes == ["succeeded"]


async def test_a_generation_that_ignores_its_abort_holds_the_drain_no_longer(
    aredis: aioredis.Redis,
) -> None:
    """A step an hour: the engine neither ends the generation nor honours its abort. Given up,
    the job is left pending here, for another worker to reclaim."""
    partition = _partition(step_ms=3_600_000)
    running = await _stopped_while_generating(aredis, partition, "ignored", drain_s=0.5)

    await asyncio.wait_for(running, 30)  # a hang guard: the drain waited for ever

    [pending] = await aredis.xpending_range(partition.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == WORKER.encode()
    assert pending["times_delivered"] == 0  # handed back, its given-up run uncounted
    record = await JobStore(aredis, KEYS, 60).get("ignored")
    assert record is not None and record.status == JobStatus.RUNNING  # no result: rerun elsewhere


async def test_a_loop_with_every_slot_busy_drains_at_a_stop_not_after_its_block(
    aredis: aioredis.Redis,
) -> None:
    """Every slot generating, the loop waits for one to free, up to its block: a stop waited
    that out (or the generation's end) before the drain began, past a grace no longer than
    CONVEYOR_BLOCK_MS. The drain begins at once and gives the never-ending generation up."""
    partition = _partition(step_ms=3_600_000, max_num_seqs=1)
    running = await _stopped_while_generating(
        aredis, partition, "busy", drain_s=0.2, block_ms=600_000
    )

    await asyncio.wait_for(running, 30)  # a hang guard: the slot's wait is 10 minutes

    [pending] = await aredis.xpending_range(partition.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == WORKER.encode() and pending["times_delivered"] == 0


async def test_a_generation_a_drain_gave_up_is_due_to_the_next_reclaim_uncounted(
    aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Given up at a stop, a generation waited out the whole visibility timeout (smollm2's 300 s)
    before any worker took it over, its run counted as a delivery: two graceful restarts (a
    rolling update) dead-lettered a healthy job (max_deliveries 2). Handed back, another
    worker's first reclaim takes it, as its first delivery."""
    config = ModelConfig(
        name="m",
        kind="generate",
        backend="tests.paced_engine:PacedEngine",
        parameters={"step_ms": 3_600_000},  # never ends within the drain
        queue=QueueLimits(visibility_timeout_s=60),
    )
    partition = Partition.of(KEYS, config, "default")
    with caplog.at_level(logging.INFO, logger="workers"):
        running = await _stopped_while_generating(aredis, partition, "handed", drain_s=0.2)
        await asyncio.wait_for(running, 30)
    [said] = [r for r in caplog.records if r.getMessage().startswith("handed given-up")]
    assert (said.__dict__["handed"], said.__dict__["given_up"]) == (1, 1)  # the log says so

    taker = Reclaimer(aredis, KEYS, partition, TAKER, 60, JobEvents("redis://unused"))
    claimed = await taker.reclaim(partition.online)  # at once, not 60 s on
    assert [d.entry.job_id for d in claimed if d.entry] == ["handed"]
    [pending] = await aredis.xpending_range(partition.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == TAKER.encode() and pending["times_delivered"] == 1


async def test_an_idle_loop_asked_to_stop_ends_its_blocking_read_at_once(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """Nothing queued, a read blocking 10 minutes: the stop waited the block out, past any
    shutdown grace no longer than CONVEYOR_BLOCK_MS."""
    partition = _partition(step_ms=100)
    patient = connect(redis_url, blocks_ms=600_000)  # its socket outlasts the block
    reader = StreamReader(patient, KEYS, partition.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    engine = PacedEngine(partition.config, "default", "")
    await engine.load()
    loop = generate_loop(patient, KEYS, partition, reader, engine, block_ms=600_000)
    running = asyncio.create_task(loop.run())

    await until_blocked_in_read(aredis)
    loop.stopping.set()
    try:
        await asyncio.wait_for(running, 30)  # a hang guard: the read's block is 10 minutes
    finally:
        await patient.aclose()
