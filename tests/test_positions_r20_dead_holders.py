"""Queue positions beside a dead worker's entries, on a real Valkey: entries pending at a
consumer with no heartbeat counted as neither ahead nor running, though the reclaimer hands them
to a live worker before the lane's newer entries, so a job behind them read a position (and an
ETA) short by as many."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys, new_job_id
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta
from shared.queue_position import QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY, STEADY_BULK = KEYS.queue("steady", "default"), KEYS.bulk_queue("steady", "default")


async def _queued(store: JobStore, stream: str) -> str:
    """A job enqueued in `stream` of `steady` as a submit enqueues it; its id."""
    job_id = new_job_id("steady", "default")
    fields = {"model": "steady", "variant": "default"}
    await store.create(RequestEntry(job_id, {"inputs": {}}, now_ms()), stream, fields)
    return job_id


async def _handed(aredis: aioredis.Redis, stream: str, consumer: str, count: int) -> None:
    """`count` entries of `stream` handed over to `consumer`."""
    for n in range(count):
        await aredis.xadd(stream, {"n": n})
    await aredis.xreadgroup(GROUP, consumer, {stream: ">"}, count=count)


async def test_a_dead_workers_entries_count_ahead_of_the_jobs_behind_them(
    aredis: aioredis.Redis,
) -> None:
    """Two entries a killed worker held, one a live worker runs, one in the bulk lane: a job
    queued behind them stands behind the two of its own lane that wait to be reclaimed, on its
    GET and on a 202 alike; the live worker's entry is running, the bulk one in another lane."""
    for stream in (STEADY, STEADY_BULK):
        await aredis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    await _handed(aredis, STEADY, "host-dead", 2)  # its worker killed: no beat
    await _handed(aredis, STEADY, "host-live", 1)
    await _handed(aredis, STEADY_BULK, "host-dead", 1)
    beat = Heartbeat("host-live", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat)
    store = JobStore(aredis, KEYS, 60)
    job_id = await _queued(store, STEADY)
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()
    record = await store.get(job_id)
    assert record is not None
    standing = await eta.of(record)
    assert standing is not None and standing.queue_position == 2
    config = eta.repository.models["steady"]
    assert eta.standing(config, "default", bulk=False, position=0).queue_position == 2
    assert eta.standing(config, "default", bulk=True, position=0).queue_position == 1
