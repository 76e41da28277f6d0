"""A job run again (its worker died mid-generation) whose new run ends before its engine yields
anything: failed at once, or cancelled while it waits in the engine. Its stream's `restart`
came only with a run's first chunk, so this run's final followed the dead run's text with no
`restart` between: an SSE reader kept that text as the answer, though the job's result has none
of it. On a real Valkey, with the paced test engine and no worker process."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.token_stream import TokenEvent
from tests.test_generate_outages import KEYS, PARTITION, WORKER, _running, _texts
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenAppend, TokenWriter


async def test_a_rerun_that_ends_before_its_first_chunk_restarts_its_stream(
    aredis: aioredis.Redis,
) -> None:
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    loop, job = await _running(aredis, reader)
    dead = TokenAppend(job.job_id, "dead-run", 1, [TokenEvent("token", "A1 ", 1)], expire=True)
    await TokenWriter(aredis, KEYS, 60).write([dead], [])
    job.redelivered = True  # as a reclaim hands the dead run's job over
    job.error = {"type": "RuntimeError", "message": "the engine refused the request"}

    await loop._publish([], [job])

    assert await _texts(aredis, job.job_id) == [b"A1 ", b"restart", b"final"]
