"""A window busy throughout sets the workers' capacity, up or down; five looks a second apart
that all saw work waiting were taken for one, though they reach four seconds back and the rate
window up to six: the fifth look after a burst read a window that began a second before the
burst, idle, and set the capacity down by that second's share (8.4 a second where the worker
drained 10; for that second the ETAs were a fifth too long and deadline admission refused jobs
the worker would start in time). On a real Valkey with a real worker heartbeat; the drained
counters are set as a worker's FINISH keeps them, and the producer's clock is the rate
window's."""

from __future__ import annotations

import math
import time

import pytest
import redis.asyncio as aioredis

from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta
from shared.queue_position import RATE_WINDOW_S, QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")
PER_S = 10  # what the worker drains while work waits
BACKLOG = 300  # more than it drains over the looks


async def _serving(client: aioredis.Redis) -> None:
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)


async def _backlog(client: aioredis.Redis, age_s: float) -> None:
    """BACKLOG entries that arrived `age_s` ago, as their ids say on the server's clock."""
    arrived_ms = int(time.time() * 1000) - int(age_s * 1000)
    for index in range(BACKLOG):
        await client.xadd(STEADY, {"n": index}, id=f"{arrived_ms}-{index + 1}")


async def _drained(client: aioredis.Redis, since: float, now: float) -> None:
    """The counters of a worker that has drained PER_S a second from `since`, as of `now`."""
    for second in range(math.floor(since), math.floor(now) + 1):
        done = max(0.0, min(second + 1, now) - max(second, since))
        await client.set(KEYS.drained(STEADY, second), math.floor(PER_S * done + 0.5))


async def _rates(
    client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    first: float,
    busy_from: float,
    looks: int,
) -> list[float]:
    """The online lane's rate at each of `looks` a second apart from `first`, the backlog
    arriving before the second, and the worker serving (and draining) from `busy_from`."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    eta = QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))
    config = eta.repository.models["steady"]
    rates = []
    for look in range(looks):
        clock = first + look
        monkeypatch.setattr(time, "time_ns", lambda at=clock: int(at * 1e9))
        if look == 1 and not await client.xlen(STEADY):
            await _backlog(client, clock - busy_from)
        if clock >= busy_from:
            await _serving(client)
            await _drained(client, busy_from, clock)
        await eta.refresh()
        rates.append(eta.lane_rate(config, "default", bulk=False))
    return rates


async def test_a_burst_after_an_idle_second_keeps_the_capacity_it_showed(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle look 50 ms before the burst, then a look a second on."""
    burst = int(time.time())
    await _serving(aredis)
    rates = (await _rates(aredis, monkeypatch, burst - 0.05, burst, RATE_WINDOW_S + 3))[1:]
    assert min(rates) >= 0.9 * PER_S, rates
    assert rates[-1] == pytest.approx(PER_S, rel=0.05), rates  # busy throughout: the window's


async def test_workers_back_to_a_backlog_are_not_timed_over_the_spell(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog that waited with no worker (a scale from zero): the look before the worker
    came saw work waiting, so the spell is not known to have begun then, and the capacity is
    the window's, never more than the worker drains (a window partly without it reads less)."""
    start = int(time.time())
    await _backlog(aredis, 60)
    rates = await _rates(aredis, monkeypatch, start + 0.95, start + 6.5, 2 * RATE_WINDOW_S + 3)
    assert max(rates) <= 1.05 * PER_S, rates
    assert rates[-1] == pytest.approx(PER_S, rel=0.1), rates
