"""Queue ETA beside a fair lane's flood (issue #17): the lane's stream holds a window at most and
a worker's read leaves it with nothing undelivered, while the flood waits in per-tenant lists
(the fair hash's `held` count). The ETA's refresh counted only the stream's undelivered entries,
so such a lane read as one with no work waiting: the workers' capacity stayed what an earlier
load measured (ETAs and deadline admission at the old speed), or was never measured at all (no
`max_queue_time_s` for jobs without a deadline), and a `bulk_share: 0` bulk head showed
`eta_ms: 0` behind the held online flood."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from shared import queue_eta
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms, stamp_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.queue_eta import Partition, QueueEta, StartBy
from shared.queue_position import RATE_WINDOW_S, PartitionLoad, QueuePositions
from tests.conftest import REPO_ROOT

KEYS = Keys()
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "queue_repository"
STEADY = KEYS.queue("steady", "default")


async def _refresh(eta: QueueEta, monkeypatch: pytest.MonkeyPatch, load: PartitionLoad) -> None:
    """One refresh with `steady` under `load` (as the drained counters and heartbeats would
    read), its lanes' backlog as Redis holds it."""

    async def read(*_: object) -> dict[Partition, PartitionLoad]:
        return {("steady", "default"): load}

    monkeypatch.setattr(queue_eta, "read_partition_loads", read)
    await eta.refresh()


FLOOD_WORKER = "w-1"  # the live worker that read the flood's entry
FLOOD_WORKERS = frozenset({FLOOD_WORKER})


async def _flood(client: aioredis.Redis, jobs: int) -> None:
    """A tenant's flood on `steady`'s online lane made fair (window 1), just after a worker's
    read: the stream's one entry delivered, the rest held back."""
    await client.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    fields: dict[str, str | int] = {"model": "steady", "variant": "default"}
    flood = [
        NewJob(RequestEntry(uuid.uuid4().hex, {}, now_ms(), tenant="a"), STEADY, fields, 1)
        for _ in range(jobs)
    ]
    await JobStore(client, KEYS, 60).create_many(flood)
    await client.xreadgroup(GROUP, FLOOD_WORKER, {STEADY: ">"})
    assert await client.hget(KEYS.fair(STEADY), "held") == str(jobs - 1).encode()


def _queue_eta(client: aioredis.Redis) -> QueueEta:
    return QueueEta(client, QueuePositions(client, KEYS), ModelRepository.load(FIXTURES))


async def test_a_held_flood_measures_the_capacity_for_deadline_admission(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood that waits held throughout is the workers' capacity: a job without a deadline
    is held to `max_queue_time_s` (it was let in without a limit, the capacity unknown)."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["steady"]
    await _flood(aredis, 40)
    for _ in range(RATE_WINDOW_S):
        await _refresh(eta, monkeypatch, PartitionLoad(3.0, serving=1, workers=FLOOD_WORKERS))
    assert eta.max_ahead(config, "default", False, StartBy.of(config, stamp_ms(), 0)) > 0


async def test_a_held_flood_sets_the_capacity_down(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers measured at 9/s on a plain backlog drain a held flood at 3/s: its ETAs are at
    3/s (they were at the stale 9/s, a third of the wait, and admission let in jobs to miss)."""
    eta = _queue_eta(aredis)
    config = eta.repository.models["steady"]
    await aredis.xgroup_create(STEADY, GROUP, id="0", mkstream=True)
    await aredis.xadd(STEADY, {"n": 1})  # work waits in the stream throughout
    for _ in range(RATE_WINDOW_S):
        await _refresh(eta, monkeypatch, PartitionLoad(9.0, serving=1))
    assert eta.lane_rate(config, "default", bulk=False) == pytest.approx(9.0)
    await aredis.delete(STEADY)
    await _flood(aredis, 40)
    for _ in range(RATE_WINDOW_S):  # its worker, beating, holds the flood's entry in hand
        await _refresh(eta, monkeypatch, PartitionLoad(3.0, serving=1, workers=FLOOD_WORKERS))
    assert eta.lane_rate(config, "default", bulk=False) == pytest.approx(3.0)
    assert eta.standing(config, "default", False, 30).eta_ms == 10_000


async def test_a_bulk_head_with_no_share_has_no_eta_behind_a_held_online_flood(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `bulk_share: 0` the bulk lane is read only once online is idle, held jobs too."""
    eta = _queue_eta(aredis)
    no_share = eta.repository.models["steady"].model_copy(update={"bulk_share": 0.0})
    await _flood(aredis, 10)
    await _refresh(eta, monkeypatch, PartitionLoad(0.0, serving=1))
    assert eta.standing(no_share, "default", bulk=True, position=0).eta_ms is None
