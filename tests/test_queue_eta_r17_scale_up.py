"""Deadline admission just after a partition scaled up from zero: its work had waited through
the whole rate window, so the window read as the workers' capacity, though no worker served for
most of it; divided by the mean of workers over its looks (0, 0, 0, 1, 1), a worker draining 40
jobs a second was measured at under 10, and jobs it would start in time were refused until the
looks without a worker left the window. On a real Valkey with a real worker heartbeat; the
drained counters are set as a worker's FINISH keeps them."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared.job_store import stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta, StartBy
from shared.queue_position import RATE_WINDOW_S, QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")
WAITING = 100
FINISHED = 20  # in the worker's first half second: 40 a second


async def test_a_scale_up_from_zero_measures_the_workers_it_has(
    aredis: aioredis.Redis,
) -> None:
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    for index in range(WAITING):
        await aredis.xadd(STEADY, {"n": index})
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    for _ in range(RATE_WINDOW_S - 1):  # scaled to zero, its work waiting
        await eta.refresh()
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat)
    await eta.refresh()
    await asyncio.sleep(0.5)
    await aredis.incrby(KEYS.drained(STEADY, int(time.time())), FINISHED)
    await eta.refresh()
    config = eta.repository.models["steady"]
    # at 40 a second, 60 ahead start in 1.5 s; read at under 10 a second, 40 may wait ahead
    now = stamp_ms()
    start_by = StartBy.of(config, now, int(now) + 4_000)
    assert eta.max_ahead(config, "default", False, start_by) >= 60
