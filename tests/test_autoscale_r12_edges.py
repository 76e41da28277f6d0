"""The local autoscaler and the backlog reads at their edges, one poll at a time on a real Valkey:
a fair lane's held count that drifted below 0 (the fair scripts and the drain-rate read clamp it)
hid queued jobs from the backlog and the queue state, and one pool's key of another type (an
operator's slip) ended `conveyor autoscale`, every pool's workers with it, or (its lease) its
stop before the workers were drained."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis

from autoscaling.local_autoscaler import PoolScaler
from conveyor.commands.autoscale import _release_leases, _tick
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import read_partition_stats
from tests.test_backlog_seconds import KEYS, batch_model, enqueue
from tests.test_local_autoscaler import Ledger

STREAM = KEYS.queue("odd", "default")
LEASE = KEYS.autoscale_leader("odd", "default")


def _pool(metric: str = "backlog_seconds") -> tuple[PoolScaler, Ledger]:
    """A pool of 0 to 200 replicas, 0.05 s a job (estimated) and 0.25 s of backlog a replica."""
    config = ModelConfig.model_validate(batch_model("odd", metric=metric))
    ledger = Ledger()
    scaler = PoolScaler.for_partition(
        config, "default", KEYS, ledger.start, ledger.stop, ledger.alive
    )
    return scaler, ledger


def test_a_held_count_below_zero_hides_no_queued_job(redis_client: redis.Redis) -> None:
    """One queued job and a held count of -1: the backlog read 0 entries, and a pool at zero
    never woke for the job."""
    scaler, ledger = _pool()
    enqueue(redis_client, STREAM, 1)
    redis_client.hset(KEYS.fair(STREAM), "held", -1)
    assert scaler.tick(redis_client, now=0.0) == 1
    assert ledger.started == ["odd:default-1"]


async def test_a_held_count_below_zero_leaves_length_and_lag_whole(
    aredis: aioredis.Redis,
) -> None:
    """The queue state (GET /v1/models, the lag gauges) read the queued job as none."""
    config = ModelConfig.model_validate(batch_model("odd"))
    await aredis.xadd(STREAM, {"job": "j0"})
    await aredis.hset(KEYS.fair(STREAM), "held", -1)
    [stats] = await read_partition_stats(aredis, KEYS, ModelRepository({"odd": config}))
    assert (stats.online.length, stats.online.lag, stats.online.held) == (1, 1, 0)


@pytest.mark.parametrize(
    ("metric", "key"),
    [("backlog_seconds", STREAM), ("stream_length", STREAM), ("stream_length", LEASE)],
)
def test_a_key_of_another_type_keeps_the_pool_as_it_is(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str], metric: str, key: str
) -> None:
    """The pool's stream (or its lease) made a hash: the poll's refusal raised out of the loop,
    which then drained every pool's workers; the pool is kept as it is, and the poll says why."""
    scaler, ledger = _pool(metric)
    enqueue(redis_client, STREAM, 12)
    assert scaler.tick(redis_client, now=0.0) > 0
    running = len(scaler.workers)
    redis_client.delete(key)
    redis_client.hset(key, "an operator's", "slip")
    _tick(scaler, redis_client, now=1.0)
    assert len(scaler.workers) == running and ledger.stopped == []
    assert "a key of another type" in capsys.readouterr().err


def test_a_lease_of_another_type_still_lets_the_stop_drain(
    redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lease made a hash under its leader: giving it up at Ctrl-C raised out of the stop
    before the workers were drained; it is left to lapse, and the stop goes on."""
    scaler, _ = _pool()
    enqueue(redis_client, STREAM, 1)
    scaler.tick(redis_client, now=0.0)
    redis_client.delete(LEASE)
    redis_client.hset(LEASE, "an operator's", "slip")
    _release_leases([scaler], redis_client)
    assert "leases left to lapse: a key of another type" in capsys.readouterr().err
    assert redis_client.type(LEASE) == b"hash"
