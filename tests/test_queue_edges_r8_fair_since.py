"""The busy spell of a fair lane's flood after a quiet spell. The spell is timed from when work
began to wait, bounded by the oldest entry's arrival, read from its stream id; a fair lane's
stream holds only entries moved in from the held lists as workers read, each under a new id,
so its oldest read as just arrived while the flood had waited since its submit: what finished
since the last look was divided over a fraction of the time, and the workers' capacity read
about twice what it was (deadline admission took jobs they could not start in time). The
submit stamps tell: the entry's own (`enq`) and the held jobs' (`{lane}:fair:since`). On a real
Valkey with a real worker heartbeat and a real fair enqueue; the drained counters are set as a
worker's FINISH keeps them, the producer's clock is the rate window's."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import QueueEta
from shared.queue_position import QueuePositions
from shared.worker_registry import Heartbeat, WorkerRegistry
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")
PER_S = 9  # what the worker finishes a second while the flood waits


async def _flood(client: aioredis.Redis, submitted_s: float) -> None:
    """Ten jobs of one tenant submitted at `submitted_s` on `steady`'s lane made fair (window
    1), the stream's one entry since read by the worker, the rest held back."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    fields: dict[str, str | int] = {"model": "steady", "variant": "default"}
    entry = [RequestEntry(uuid.uuid4().hex, {}, submitted_s * 1000) for _ in range(10)]
    await JobStore(client, KEYS, 60).create_many([NewJob(e, STEADY, fields, 1) for e in entry])
    await client.xreadgroup(GROUP, "w-1", {STEADY: ">"})


async def _look(eta: QueueEta, monkeypatch: pytest.MonkeyPatch, clock: float) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: int(clock * 1e9))
    await eta.refresh()


async def test_a_fair_floods_spell_is_timed_from_its_submit(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    second = int(now)
    await WorkerRegistry(aredis, KEYS).publish(
        Heartbeat("w-1", "host", 1, "serving", models=["steady:default"])
    )
    for at in range(second - 10, second):  # a light load: a job a second
        await aredis.set(KEYS.drained(STEADY, at), 1)
    eta = QueueEta(aredis, QueuePositions(aredis, KEYS), ModelRepository.load(FIXTURES))
    await _look(eta, monkeypatch, now - 1.0)  # none waiting
    await _flood(aredis, now - 0.9)
    for at, clock in ((second, now), (second + 1, now + 1.0)):
        await aredis.set(KEYS.drained(STEADY, at), PER_S)
        await _look(eta, monkeypatch, clock)
    config = eta.repository.models["steady"]
    # 18 finished over the 1.9 s the flood waited; timed from the moved entry's id, over 1 s
    assert eta.lane_rate(config, "default", bulk=False) < 1.5 * PER_S
