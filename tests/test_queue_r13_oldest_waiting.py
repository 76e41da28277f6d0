"""The busy spell is timed from the arrival of the oldest job waiting, not of the oldest entry in
the lane: the refresh read the stream's first entry, which is in flight while a long job runs or
a dead worker's entry waits to be reclaimed (a visibility timeout). A burst seen just after it
arrived then read as waiting since before the last look, so that look's idle second timed it:
the light load's arrivals (about 1 job a second) became the workers' capacity, and deadline
admission took 3 jobs with `ttl_s: 4` where the worker starts 9 a second. On a real Valkey with a
real worker heartbeat; the drained counters are set as a worker's FINISH keeps them, and the
producer's clock is the rate window's."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared.drain_rate import drain_rates_and_waiting
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
IN_HAND_FOR_S = 60  # how long ago the entry a dead worker holds arrived
BURST = 20


async def _dead_workers_entry_and_a_light_load(client: aioredis.Redis) -> None:
    """`steady` with one serving worker that finished a job a second, and an entry a dead worker
    was handed a minute ago, pending until reclaimed."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    arrived_ms = int(time.time() * 1000) - IN_HAND_FOR_S * 1000
    await client.xadd(STEADY, {"n": "in hand"}, id=f"{arrived_ms}-1")
    await client.xreadgroup(GROUP, "w-dead", {STEADY: ">"})
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    second = int(time.time())
    for past in range(RATE_WINDOW_S + 2):
        await client.set(KEYS.drained(STEADY, second - past), 1)


async def _burst(client: aioredis.Redis) -> None:
    for index in range(BURST):
        await client.xadd(STEADY, {"n": index})


async def test_the_oldest_waiting_job_is_not_one_in_flight(aredis: aioredis.Redis) -> None:
    await _dead_workers_entry_and_a_light_load(aredis)
    await _burst(aredis)
    lanes = [(STEADY, KEYS.bulk_queue("steady", "default"))]
    (backlog,) = await drain_rates_and_waiting(aredis, KEYS, lanes, RATE_WINDOW_S)
    assert backlog is not None
    assert backlog.waiting == [BURST, 0] and backlog.in_flight == 1
    assert backlog.oldest_s < IN_HAND_FOR_S / 2, backlog  # the burst's age, not the entry's


async def test_a_burst_seen_as_it_arrives_beside_an_entry_in_hand_measures_nothing(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look that saw no work waiting, then a burst that arrived just before the next look a
    second later: too soon to time the workers, as without the entry in hand."""
    await _dead_workers_entry_and_a_light_load(aredis)
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    config = eta.repository.models["steady"]
    first = time.time()
    for clock in (first, first + 1.0):
        monkeypatch.setattr(time, "time_ns", lambda at=clock: int(at * 1e9))
        await eta.refresh()
        if clock == first:
            await _burst(aredis)
    now = stamp_ms()
    # no capacity yet: admitted (it was measured at about 1 a second: 3 may wait, not the burst)
    assert eta.max_ahead(config, "default", False, StartBy.of(config, now, int(now) + 4_000)) == -1
