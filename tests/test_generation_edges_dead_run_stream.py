"""A generate job whose worker died mid-generation, then cancelled (or past its deadline) before
another worker took it over, is acknowledged at the takeover without running again: its dead
run's token stream, partial text and no final, kept the result TTL (a day by default) where a
stream whose job ended keeps CONVEYOR_TOKEN_STREAM_TTL_S (its readers build the final from the
job). On a real Valkey with the paced test engine and no worker process."""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.token_stream import TokenEvent
from tests.lane_rig import generate_loop
from tests.paced_engine import PacedEngine
from workers.partition.partition import Partition
from workers.partition.stream_reader import Delivery, StreamReader
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("deadrun:")
CONFIG = ModelConfig(name="m", kind="generate", backend="tests.paced_engine:PacedEngine")
PARTITION = Partition.of(KEYS, CONFIG, "default")
RESULT_TTL_S = 60  # the rig's writers'
ENDED_TTL_S = 5


async def test_a_dead_runs_stream_of_a_job_that_will_not_run_again_gets_the_short_ttl(
    aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_TOKEN_STREAM_TTL_S=str(ENDED_TTL_S))
    store = JobStore(aredis, KEYS, RESULT_TTL_S)
    entry = RequestEntry("gone", {"inputs": {"prompt": "one two"}}, now_ms())
    await store.create(entry, PARTITION.online, {})
    dead_run = TokenAppend("gone", "dead-run", 1, [TokenEvent("token", "one ", 1)], expire=True)
    await TokenWriter(aredis, KEYS, RESULT_TTL_S).write([dead_run], [])
    assert await aredis.ttl(KEYS.tokens("gone")) > ENDED_TTL_S  # as the dead worker left it
    [(entry_id, _)] = await aredis.xrange(PARTITION.online)
    await store.transition("gone", JobStatus.RUNNING)  # as the dead worker marked it
    await store.transition("gone", JobStatus.CANCELLED)
    reader = StreamReader(aredis, KEYS, PARTITION.streams, "box-2", mark_on_read=True)
    await reader.ensure_groups()
    loop = generate_loop(aredis, KEYS, PARTITION, reader, PacedEngine(CONFIG, "default", ""))
    taken_over = Delivery(entry_id, entry, JobStatus.CANCELLED, now_ms(), redelivered=True)
    await loop._start_all(PARTITION.online, [taken_over])
    assert not loop.running  # acknowledged, not run again
    assert 0 < await aredis.ttl(KEYS.tokens("gone")) <= ENDED_TTL_S
