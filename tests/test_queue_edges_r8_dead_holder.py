"""The ETA of the job at the head of a cold partition (no rate known) whose only busy consumer
died: its entries stay in its pending list until reclaimed (the visibility timeout), and counted
as in flight they kept the head's `eta_ms` null, "a worker busy on a long job", while the live
worker, idle, read it at once. Entries held by a consumer with no heartbeat are not being run.
On a real Valkey with a real worker heartbeat; nothing finished in the rate window."""

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


async def test_a_dead_consumers_entries_do_not_hold_the_head_back(aredis: aioredis.Redis) -> None:
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    await aredis.xadd(STEADY, {"n": 0})
    await aredis.xreadgroup(GROUP, "host-dead", {STEADY: ">"})  # its worker killed, no beat
    await aredis.xadd(STEADY, {"n": 1})  # the head
    beat = Heartbeat("host-live", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat)
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()
    config = eta.repository.models["steady"]
    assert eta.standing(config, "default", bulk=False, position=0).eta_ms == 0
    # the live worker holding one: the head waits for it
    await aredis.xreadgroup(GROUP, "host-live", {STEADY: ">"})
    await aredis.xadd(STEADY, {"n": 2})
    await eta.refresh()
    assert eta.standing(config, "default", bulk=False, position=0).eta_ms is None
