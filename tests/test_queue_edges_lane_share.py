"""A lane's ETA beside the other lane's trickle: the lane scheduler gives the bulk lane only its
`bulk_share` of micro-batches while online jobs wait, and every other one. A bulk backlog behind
an online trickle (a job a second, nothing waiting) was drained at the share all the same, as
soon as the online lane had finished anything in the rate window: with the default share of 0.2
its ETAs were six times too long, and deadline admission refused bulk jobs its workers would
have started in time. On a real Valkey with a real worker heartbeat; the drained counters are
set as a worker's FINISH keeps them."""

from __future__ import annotations

import contextlib
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.job_store import stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta, StartBy
from shared.queue_position import QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
ONLINE = KEYS.queue("idle", "default")  # no worker runs it: what waits in it stays
BULK = KEYS.bulk_queue("idle", "default")


async def _lanes(client: aioredis.Redis, per_s: dict[str, int], waiting: dict[str, int]) -> None:
    """One serving worker that finished `per_s` entries of each lane every second of the rate
    window, with `waiting` entries undelivered in each."""
    for stream in (ONLINE, BULK):
        with contextlib.suppress(ResponseError):
            await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for index in range(waiting.get(stream, 0)):
            await client.xadd(stream, {"n": index})
        second = int(time.time())
        for at in range(second - 10, second + 30):
            await client.set(KEYS.drained(stream, at), per_s.get(stream, 0))
    beat = Heartbeat("w-1", "host", 1, "serving", models=["idle:default"])
    await WorkerRegistry(client, KEYS).publish(beat)


async def _refreshed(client: aioredis.Redis) -> QueueEta:
    eta = QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()
    return eta


async def test_a_bulk_backlog_beside_an_online_trickle_drains_at_what_it_leaves(
    aredis: aioredis.Redis,
) -> None:
    await _lanes(aredis, {ONLINE: 1, BULK: 9}, {BULK: 40})
    eta = await _refreshed(aredis)
    config = eta.repository.models["idle"]
    load = eta.load("idle", "default")
    assert load is not None and load.online_per_s > 0
    rate = eta.lane_rate(config, "default", bulk=True)
    assert abs(rate - load.bulk_per_s) < 1e-6, (rate, load)
    # 30 bulk entries ahead start within about 3.3 s: a 4 s deadline is met, not refused
    start_by = StartBy.of(config, stamp_ms(), int(stamp_ms()) + 4_000)
    assert eta.max_ahead(config, "default", True, start_by) >= 30


async def test_an_online_backlog_beside_a_bulk_trickle_drains_at_what_it_leaves(
    aredis: aioredis.Redis,
) -> None:
    await _lanes(aredis, {ONLINE: 9, BULK: 1}, {ONLINE: 40})
    eta = await _refreshed(aredis)
    config = eta.repository.models["idle"]
    load = eta.load("idle", "default")
    assert load is not None
    assert abs(eta.lane_rate(config, "default", bulk=False) - load.online_per_s) < 1e-6


async def test_waiting_online_work_still_holds_the_bulk_lane_to_its_share(
    aredis: aioredis.Redis,
) -> None:
    await _lanes(aredis, {ONLINE: 1, BULK: 9}, {ONLINE: 1, BULK: 40})
    eta = await _refreshed(aredis)
    config = eta.repository.models["idle"]
    load = eta.load("idle", "default")
    assert load is not None
    total = load.online_per_s + load.bulk_per_s
    share = config.bulk_share / (1 + config.bulk_share)
    assert abs(eta.lane_rate(config, "default", bulk=True) - total * share) < 1e-6
