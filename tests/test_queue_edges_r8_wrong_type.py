"""The ETA refresh beside a partition one of whose keys is of another type (an operator's slip: a
lane's fair hash written as a string). The refresh reads every partition in one round trip, and
that partition's EVAL failed it whole, every second: every model's loads stayed as the last
good refresh left them (a pool whose workers all died went on showing them serving, and its
jobs an ETA), or, from the start, none at all. The queue state leaves such a partition out
(shared/partition_stats.py); so does the refresh now. On a real Valkey with a real worker
heartbeat; the drained counters are set as a worker's FINISH keeps them."""

from __future__ import annotations

import time

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


async def test_a_key_of_another_type_leaves_only_its_partition_out(
    aredis: aioredis.Redis,
) -> None:
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    for index in range(4):
        await aredis.xadd(STEADY, {"n": index})
    second = int(time.time())
    for at in range(second - 10, second + 30):
        await aredis.set(KEYS.drained(STEADY, at), 2)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default", "idle:default"])
    await WorkerRegistry(aredis, KEYS).publish(beat)
    await aredis.set(KEYS.fair(KEYS.queue("idle", "default")), "not a hash")
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()  # raised WRONGTYPE: no partition's load was read
    steady = eta.load("steady", "default")
    assert steady is not None and steady.serving == 1 and steady.online_per_s > 0
    assert eta.load("idle", "default") is None
    config = eta.repository.models["steady"]
    assert eta.standing(config, "default", bulk=False, position=3).eta_ms is not None
