"""Deadline admission after a light load weighs a burst by what the workers drained while it
waited, not by the rate window's whole span: a burst that arrived after a light load had its
window read the load's arrivals and idle seconds too (about 2 jobs/s where the worker drains 9),
and a second burst 1.5 s later had 11 of 20 jobs refused `deadline_unmeetable`, each of which
the worker started within its deadline (on the real stack:
tests/test_deadline_admission_after_light_load.py). On a real Valkey with a real worker
heartbeat; the drained counters are set as a worker's FINISH keeps them."""

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
BURST = 20
FINISHED = 9  # of the first burst, by the second look: the worker's ~9 jobs/s


async def _light_load(client: aioredis.Redis) -> QueueEta:
    """`steady` with one serving worker that finished a job a second for the whole window and
    has none waiting, looked at once."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    second = int(time.time())
    for past in range(1, RATE_WINDOW_S + 2):
        await client.set(KEYS.drained(STEADY, second - past), 1)
    eta = QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()
    return eta


async def _burst_looked_at_a_second_on(client: aioredis.Redis, eta: QueueEta) -> int:
    """A burst of BURST jobs, FINISHED of them done by the next look a second later (the
    rest waiting); the jobs still waiting."""
    for index in range(BURST - FINISHED):
        await client.xadd(STEADY, {"n": index})
    await asyncio.sleep(1.0)
    await client.incrby(KEYS.drained(STEADY, int(time.time())), FINISHED)
    await eta.refresh()
    return BURST - FINISHED


def _most_ahead(eta: QueueEta, within_ms: int) -> int:
    config = eta.repository.models["steady"]
    now = stamp_ms()
    return eta.max_ahead(config, "default", False, StartBy.of(config, now, int(now) + within_ms))


async def test_a_burst_after_a_light_load_meets_the_deadlines_it_can(
    aredis: aioredis.Redis,
) -> None:
    eta = await _light_load(aredis)
    assert _most_ahead(eta, 6_000) == -1  # the capacity not measured: nothing refused
    waiting = await _burst_looked_at_a_second_on(aredis, eta)
    # a second burst with ttl_s 6: its last job has `waiting` + BURST - 1 ahead, which the
    # worker (9 a second) starts in about 3.3 s; the window's 2.2 a second let 13 wait ahead
    assert _most_ahead(eta, 6_000) >= waiting + BURST - 1


async def test_a_deadline_the_workers_cannot_meet_is_still_refused(
    aredis: aioredis.Redis,
) -> None:
    eta = await _light_load(aredis)
    waiting = await _burst_looked_at_a_second_on(aredis, eta)
    # 500 ms: the worker starts about 4 of the jobs waiting by then, not all of them
    assert 0 <= _most_ahead(eta, 500) < waiting


async def test_a_light_load_job_caught_before_it_is_read_measures_nothing(
    aredis: aioredis.Redis,
) -> None:
    """A look that caught a light load's job before the idle worker read it took the window's
    arrival rate (1/s) for the capacity, kept as a floor: the next burst's jobs with ttl_s 4
    were refused from the fifth on ("4 jobs are ahead: it would start in about 4164 ms")."""
    eta = await _light_load(aredis)
    await aredis.xadd(STEADY, {"n": 0})
    await eta.refresh()
    assert _most_ahead(eta, 4_000) == -1


async def test_a_burst_looked_at_as_it_arrives_measures_nothing(
    aredis: aioredis.Redis,
) -> None:
    """A look a moment after a burst arrived, its busy spell too short to time, took the
    window's light-load rate (~1/s) for the capacity: until the next look, a second burst's
    jobs with ttl_s 4 were refused from the fourth on ("13 jobs are ahead: it would start in
    about 14000 ms"), each of which the worker started in time."""
    eta = await _light_load(aredis)
    for index in range(BURST - FINISHED):
        await aredis.xadd(STEADY, {"n": index})
    await eta.refresh()
    assert _most_ahead(eta, 4_000) == -1
