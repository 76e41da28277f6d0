"""The workers' capacity across a producer clock stepped back (NTP) during a busy spell. The spell
times what finished from when work began to wait; a look whose clock is behind the last one's
read the seconds before that look's window as finished since it (a busy minute's counters,
long done), and a spell begun in what is now the future was timed from there: once the clock
came back, hundreds of entries over half a second read as the capacity, and deadline admission
accepted jobs the workers could not start in time. Such a look times nothing: the spell starts
over from it. On a real Valkey with a real worker heartbeat; the drained counters are set as a
worker's FINISH keeps them, the producer's clock (`time.time_ns`, which Redis's clock as it
reads it follows) the rate window's."""

from __future__ import annotations

import time

import pytest
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
BUSY_MINUTE = range(-9, -6)  # seconds (from the first look's) of a spell long done, 50 a second


async def _light_load_then_a_burst(client: aioredis.Redis, second: int) -> None:
    """`steady` with one serving worker that finished a job a second around `second` (50 a
    second a little before), and a burst waiting."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    beat = Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    await WorkerRegistry(client, KEYS).publish(beat)
    for at in range(second - 12, second + 3):
        busy = at - second in BUSY_MINUTE
        await client.set(KEYS.drained(STEADY, at), 50 if busy else 1)
    for index in range(20):
        await client.xadd(STEADY, {"n": index})


async def test_a_clock_stepped_back_mid_spell_times_nothing(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = int(time.time())
    await _light_load_then_a_burst(aredis, second)
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    config = eta.repository.models["steady"]
    for clock in (second + 0.5, second - 2.5, second + 1.0):  # stepped back 3 s, then on
        monkeypatch.setattr(time, "time_ns", lambda at=clock: int(at * 1e9))
        await eta.refresh()
    # a job a second, as the window says: the busy minute's 150 over 0.5 s read as 300 a second
    assert eta.lane_rate(config, "default", bulk=False) < 5
