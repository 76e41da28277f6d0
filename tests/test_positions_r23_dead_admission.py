"""Deadline admission and positions beside a dead worker's entries, on a real Valkey: a job's
position and ETA count the entries a consumer with no heartbeat holds (reclaimed, they run
first), but ENQUEUE's bound counted only the undelivered ones, so a job was admitted with a 202
whose ETA was past its deadline (and it expired unrun); and an entry of a job cancelled while
the dead consumer held it counted ahead too, though the reclaimer only acknowledges it."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.job_states import JobStatus
from shared.job_store import JobStore, stamp_ms
from shared.keys import GROUP
from shared.settings import Settings
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.app_client import app_client
from tests.test_positions_r20_dead_holders import STEADY, _queued
from tests.test_queue_eta_deadlines import FIXTURES, IDLE, KEYS, _measured, _queue_eta

UNDELIVERED, DEAD = 20, 20  # the lane's entries: waiting, and held by a killed worker


async def _beside_a_dead_worker(client: aioredis.Redis) -> None:
    """`idle` drained at 10/s by a live worker, its lane holding DEAD entries a consumer with
    no heartbeat was handed, then UNDELIVERED more."""
    await _measured(client, IDLE, DEAD + UNDELIVERED)
    await client.xreadgroup(GROUP, "host-dead", {IDLE: ">"}, count=DEAD)


async def test_admission_counts_a_dead_workers_entries_as_the_eta_does(
    aredis: aioredis.Redis,
) -> None:
    """For any number undelivered ahead, a job is admitted exactly when the ETA it is shown
    (which counts the dead worker's entries) meets its deadline: none of a budget the dead
    entries alone use up is left (refused with none ahead, which ENQUEUE's bound admits)."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["idle"]
    await _beside_a_dead_worker(aredis)
    await eta.refresh()
    admit = eta.admission(config, "default")
    enqueued = stamp_ms() - 20
    for ahead in range(UNDELIVERED + 5):
        shown = eta.standing(config, "default", False, ahead)
        assert shown.queue_position == ahead + DEAD and shown.eta_ms is not None
        on_time = admit(False, enqueued, int(enqueued) + shown.eta_ms)
        assert on_time is not None and on_time >= ahead, (ahead, shown, on_time)
        late = admit(False, enqueued, int(enqueued) + shown.eta_ms - 1)
        assert late is None or late < ahead, (ahead, shown, late)


async def test_a_submit_whose_eta_counting_the_dead_entries_is_late_gets_429(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A deadline the 20 undelivered entries ahead leave time for, but not the 20 a killed
    worker holds, which come first: refused as deadline_unmeetable, counting them ahead, not
    admitted with a 202 whose ETA is past the deadline; a deadline past that ETA is admitted."""
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        auth="disabled",
        model_repository=str(FIXTURES),
    )
    await _beside_a_dead_worker(aredis)  # before a first refresh, which measures it
    app = create_app(settings)
    async with app_client(app) as api:
        eta = app.state.conveyor.queue_eta
        await (
            app.state.conveyor.eta_refresher.stop()
        )  # the rate read below is the one the submits are weighed by
        await eta.refresh()
        config = eta.repository.models["idle"]
        shown = eta.standing(config, "default", False, UNDELIVERED).eta_ms
        assert shown is not None
        # time enough for the undelivered entries, not for the dead worker's too
        deadline = time.time() + shown * 0.75 / 1000
        body = {"model": "idle", "inputs": {}}
        response = await api.post("/v1/jobs", json={**body, "deadline": deadline})
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert error["type"] == "deadline_unmeetable"
        assert error["message"].startswith(f"{UNDELIVERED + DEAD} jobs are ahead"), error
        response = await api.post("/v1/jobs", json={**body, "deadline": time.time() + 60})
        assert response.status_code == 202, response.text
        assert response.json()["queue_position"] == UNDELIVERED + DEAD


async def test_a_cancelled_jobs_entry_at_a_dead_worker_is_not_ahead(aredis: aioredis.Redis) -> None:
    """Two jobs a killed worker was handed, then one of them cancelled (its entry stays pending
    at the dead consumer): the job queued behind them stands behind two, then behind one."""
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    store = JobStore(aredis, KEYS, 60)
    cancelled, _ = await _queued(store, STEADY), await _queued(store, STEADY)
    await aredis.xreadgroup(GROUP, "host-dead", {STEADY: ">"}, count=2)
    behind = await _queued(store, STEADY)
    beat = Heartbeat("host-live", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat)
    eta = _queue_eta(aredis)
    record = await store.get(behind)
    assert record is not None

    async def position() -> int:
        await eta.refresh()
        standing = await eta.of(record)
        assert standing is not None
        return standing.queue_position

    assert await position() == 2
    assert (await store.transition(cancelled, JobStatus.CANCELLED)).status == "cancelled"
    assert (await aredis.xpending(STEADY, GROUP))["pending"] == 2
    assert await position() == 1
