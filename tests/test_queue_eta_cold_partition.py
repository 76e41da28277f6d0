"""The ETA of a job at the head of a cold partition (no rate known: nothing finished within the
rate window, no capacity measured): 0 only when a serving worker has nothing in hand. Workers
busy on jobs longer than the window (a generate model's slots full, a long micro-batch) had
the head job shown `eta_ms: 0`, "starts now", for as long as those jobs ran. On a real Valkey
with a real worker heartbeat; no drained counters (nothing finished)."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta
from shared.queue_position import QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")


async def _cold_partition(client: aioredis.Redis) -> QueueEta:
    """`steady` with one serving worker that has finished nothing, read once."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    return QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))


async def test_the_head_waits_while_the_worker_is_busy(aredis: aioredis.Redis) -> None:
    eta = await _cold_partition(aredis)
    config = eta.repository.models["steady"]
    running = await aredis.xadd(STEADY, {"n": 0})
    await aredis.xreadgroup(GROUP, "w-1", {STEADY: ">"})  # in the worker's hands, running long
    await aredis.xadd(STEADY, {"n": 1})  # the head, waiting for it
    await eta.refresh()
    assert eta.lane_rate(config, "default", bulk=False) == 0
    assert eta.standing(config, "default", bulk=False, position=0).eta_ms is None
    await aredis.xack(STEADY, GROUP, running)  # it ended: the worker is free
    await aredis.xdel(STEADY, running)
    await eta.refresh()
    assert eta.standing(config, "default", bulk=False, position=0).eta_ms == 0


async def test_an_idle_worker_starts_the_head_at_once(aredis: aioredis.Redis) -> None:
    eta = await _cold_partition(aredis)
    config = eta.repository.models["steady"]
    await aredis.xadd(STEADY, {"n": 0})
    await eta.refresh()
    assert eta.standing(config, "default", bulk=False, position=0).eta_ms == 0
    assert eta.standing(config, "default", bulk=True, position=0).eta_ms == 0
    assert eta.standing(config, "default", bulk=False, position=1).eta_ms is None
