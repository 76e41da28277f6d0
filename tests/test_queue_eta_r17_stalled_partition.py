"""A partition whose worker still beats but drains nothing (its engine stuck, a micro-batch
hung) kept the capacity measured before the stall until the heartbeat lapsed, which a stuck
engine's never does: its jobs' ETAs kept promising the old rate and deadline admission
accepted jobs that could not start in time. On a real Valkey with a real worker heartbeat; the
drained counters are set as a worker's FINISH keeps them, and the stall is read from their
seconds and the waiting entries' ids, not from a clock the test waits on."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared.job_store import stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta, StartBy, eta_ms
from shared.queue_position import QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")
PER_S = 10  # jobs the drained counters say finished each second before the stall
WAITING = 30
AHEAD = 20  # 2 s of work at PER_S


async def _draining(client: aioredis.Redis, second: int) -> QueueEta:
    """`steady` with one serving worker that drained PER_S a second behind WAITING entries
    that arrived 8 s ago, looked at once."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    arrived_ms = (second - 8) * 1000
    for index in range(WAITING):
        await client.xadd(STEADY, {"n": index}, id=f"{arrived_ms}-{index}")
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    for at in range(second - 10, second + 3):
        await client.set(KEYS.drained(STEADY, at), PER_S)
    eta = QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))
    await eta.refresh()
    return eta


async def _nothing_drained_from(
    client: aioredis.Redis, eta: QueueEta, second: int, since: int
) -> None:
    """The worker finished nothing from `since` on (the counters `_draining` set at `second`
    gone), looked at again."""
    await client.delete(*(KEYS.drained(STEADY, at) for at in range(since, second + 3)))
    await eta.refresh()


def _standing_ms(eta: QueueEta) -> int:
    config = eta.repository.models["steady"]
    standing = eta.standing(config, "default", bulk=False, position=AHEAD)
    assert standing.eta_ms is not None
    return standing.eta_ms


def _most_ahead(eta: QueueEta, within_ms: int) -> int:
    config = eta.repository.models["steady"]
    now = stamp_ms()
    return eta.max_ahead(config, "default", False, StartBy.of(config, now, int(now) + within_ms))


async def test_a_stall_grows_the_eta_and_refuses_what_it_makes_late(
    aredis: aioredis.Redis,
) -> None:
    second = int(time.time())
    eta = await _draining(aredis, second)
    config = eta.repository.models["steady"]
    assert _most_ahead(eta, 2_500) >= AHEAD  # draining: 20 ahead start in about 2 s
    # nothing finished for the last 3 s: the old capacity said 2 s for 20 ahead
    await _nothing_drained_from(aredis, eta, second, second - 3)
    assert eta.lane_rate(config, "default", bulk=False) >= PER_S  # still the old capacity
    assert _standing_ms(eta) >= 2_900
    assert _most_ahead(eta, 2_500) == 0
    # nothing finished over the whole rate window: the stall goes back to the oldest arrival
    await _nothing_drained_from(aredis, eta, second, second - 10)
    assert _standing_ms(eta) >= 7_900
    assert _most_ahead(eta, 7_000) == 0


async def test_a_partition_draining_now_keeps_its_rate_eta(aredis: aioredis.Redis) -> None:
    """No floor while entries finish this second, though the oldest job waited 8 s."""
    eta = await _draining(aredis, int(time.time()))
    config = eta.repository.models["steady"]
    rate = eta.lane_rate(config, "default", bulk=False)
    assert _standing_ms(eta) == eta_ms(AHEAD, rate)
