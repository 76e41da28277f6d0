"""A generate loop through a Redis outage, on a real Valkey with the paced test engine and no
worker process: a touch that an outage failed is tried again at once (it used to wait another
third of the visibility timeout, and a reclaimer could take a job still generating), and a run
whose token stream another run of its job wrote since (a reclaim after the outage) gives the
job up instead of interleaving its tokens with the new run's, its first write included, and a
write retried after an outage leaves out the jobs given up meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.token_stream import TokenEvent
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_job import RunningJob
from workers.generation.generate_loop import GenerateLoop
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TickWritten, TokenAppend, TokenWriter

KEYS = Keys("genout:")
CONFIG = ModelConfig(
    name="m",
    kind="generate",
    backend="tests.paced_engine:PacedEngine",
    queue=QueueLimits(visibility_timeout_s=1),  # a touch is due every third of a second
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
WORKER = "box-7-77"
TAKER = "box-8-88"  # the worker that reclaims a job while WORKER cannot reach Redis


class OutageOnce(StreamReader):
    """A reader whose first touch meets an outage (Redis unreachable), as a worker's may."""

    failed = False

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> list[str]:
        if not self.failed:
            self.failed = True
            raise RedisConnectionError("Error 111 connecting to Redis. Connection refused.")
        return await super().touch(stream, entry_ids)


async def _running(aredis: aioredis.Redis, reader: StreamReader) -> tuple[GenerateLoop, RunningJob]:
    """A loop on `reader`, running a job it read (the engine is not asked to generate it)."""
    entry = RequestEntry("long", {"inputs": {"prompt": "a long answer"}}, now_ms())
    await JobStore(aredis, KEYS, 60).create(entry, PARTITION.online, {"model": "m"})
    await reader.ensure_groups()
    [(stream, [delivery])] = await reader.wait([PARTITION.online], 1, None)
    engine = PacedEngine(CONFIG, "default", "")
    await engine.load()
    loop = generate_loop(aredis, KEYS, PARTITION, reader, engine)
    job = RunningJob(delivery, stream, GenerateRequest("long"), delivery.redelivered)
    loop.running[job.job_id] = job
    return loop, job


class WriteOutageOnce(TokenWriter):
    """A writer whose first write meets an outage, during which the loop gives `job` up (its
    drain at shutdown, say): the write is retried once Redis is back."""

    def __init__(self, client: aioredis.Redis, job: RunningJob) -> None:
        super().__init__(client, KEYS, 60)
        self.job = job
        self.failed = False

    async def write(self, appends: Sequence[TokenAppend], watch: Sequence[str]) -> TickWritten:
        if not self.failed:
            self.failed = True
            self.job.abandoned = True
            raise RedisConnectionError("Error 111 connecting to Redis. Connection refused.")
        return await super().write(appends, watch)


async def _idle_ms(aredis: aioredis.Redis) -> int:
    [row] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    return int(row["time_since_delivered"])


async def _texts(aredis: aioredis.Redis, job_id: str) -> list[bytes]:
    rows = await aredis.xrange(KEYS.tokens(job_id))
    return [fields.get(b"text", fields[b"kind"]) for _, fields in rows]


async def test_a_touch_an_outage_failed_is_tried_again_at_once(aredis: aioredis.Redis) -> None:
    """The next touch was scheduled before the touch ran: failed, it waited a third of the
    visibility timeout more, and an outage a little shorter than the timeout let another
    worker's reclaimer take over a generation still running here."""
    reader = OutageOnce(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    loop, _ = await _running(aredis, reader)
    await asyncio.sleep(PARTITION.touch_every_s + 0.1)  # a touch is due
    idle_before = await _idle_ms(aredis)
    with pytest.raises(RedisConnectionError):
        await loop._touch_running()
    await loop._touch_running()  # Redis is back
    assert await _idle_ms(aredis) < idle_before  # touched: the idle time was reset


async def test_a_run_another_run_of_its_job_overtook_gives_the_job_up(
    aredis: aioredis.Redis,
) -> None:
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    loop, job = await _running(aredis, reader)
    await loop._publish([(job, TokenChunk("A1 "), now_ms())], [])
    restart = [TokenEvent("restart"), TokenEvent("token", text="B1 ", tokens=1)]
    rerun = TokenAppend(job.job_id, "another-run", 1, restart, expire=True)
    await TokenWriter(aredis, KEYS, 60).write([rerun], [])  # the job reclaimed meanwhile

    await loop._publish([(job, TokenChunk("A2 ", finish_reason="length"), now_ms())], [])
    await loop._publish([], [job])  # its end writes nothing: the result is the new run's

    assert job.abandoned and job.job_id not in loop.running
    assert await _texts(aredis, job.job_id) == [b"A1 ", b"restart", b"B1 "]
    record = await JobStore(aredis, KEYS, 60).get(job.job_id)
    assert record is not None and record.status == JobStatus.RUNNING
    assert len(await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)) == 1


async def test_a_first_write_after_another_worker_took_the_job_over_gives_it_up(
    aredis: aioredis.Redis,
) -> None:
    """A run cut off from Redis before its first write succeeded, whose job another worker took
    over and wrote meanwhile: its first write was appended after the new run's text, no
    `restart` before it (it is no redelivery), and readers got both runs' text mixed."""
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    loop, job = await _running(aredis, reader)
    await aredis.xclaim(PARTITION.online, GROUP, TAKER, 0, [job.delivery.entry_id])
    restart = [TokenEvent("restart"), TokenEvent("token", text="B1 ", tokens=1)]
    rerun = TokenAppend(job.job_id, "another-run", 1, restart, expire=True)
    await TokenWriter(aredis, KEYS, 60).write([rerun], [])

    await loop._publish([(job, TokenChunk("A1 "), now_ms())], [])  # Redis is back

    assert job.abandoned
    assert await _texts(aredis, job.job_id) == [b"restart", b"B1 "]
    [row] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert row["consumer"] == TAKER.encode()


async def test_a_write_retried_after_an_outage_leaves_out_jobs_given_up_meanwhile(
    aredis: aioredis.Redis,
) -> None:
    """The retried write was the one built before the outage: a job given up while it lasted
    still had its tokens written, though they are another run's to write now."""
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    loop, job = await _running(aredis, reader)
    loop.tokens = WriteOutageOnce(aredis, job)

    await loop._publish([(job, TokenChunk("A1 "), now_ms())], [])

    assert loop.tokens.failed and job.abandoned
    assert await _texts(aredis, job.job_id) == []
