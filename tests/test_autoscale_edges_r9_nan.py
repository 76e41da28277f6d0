"""The local autoscaler on a seconds-of-backlog metric whose measured cost is no number: a cost
hash holding `nan` (or `inf` for an empty queue, whose backlog is 0 x inf) made the formula NaN,
and its cut to thousandths raised, which ended `conveyor autoscale` and drained every pool's
workers. Such a cost reads as not measured (shared/backlog.py): the pool scales on its
estimate."""

from __future__ import annotations

import pytest
import redis

from autoscaling.local_autoscaler import PoolScaler
from conveyor.commands.autoscale import _tick
from shared.model_repository import ModelConfig
from tests.test_backlog_seconds import KEYS, batch_model, enqueue
from tests.test_local_autoscaler import Ledger


@pytest.mark.parametrize(
    ("cost", "queued"),
    [({"seconds_per_unit": "0.1", "units_per_job": "nan"}, 3), ({"seconds_per_unit": "inf"}, 0)],
)
def test_a_cost_that_is_no_number_scales_on_the_estimate(
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    cost: dict[str, str],
    queued: int,
) -> None:
    config = ModelConfig.model_validate(batch_model("odd"))
    ledger = Ledger()
    scaler = PoolScaler.for_partition(
        config, "default", KEYS, ledger.start, ledger.stop, ledger.alive
    )
    enqueue(redis_client, KEYS.queue("odd", "default"), 12)
    assert scaler.tick(redis_client, now=0.0) == 3  # 12 jobs x 0.05 s at 0.25 s a replica
    redis_client.delete(KEYS.queue("odd", "default"))
    enqueue(redis_client, KEYS.queue("odd", "default"), queued)
    redis_client.hset(KEYS.service_cost("odd", "default"), mapping=cost)
    _tick(scaler, redis_client, now=1.0)  # raised ValueError: NaN cut to thousandths
    assert len(scaler.workers) == 3 and ledger.stopped == []  # the scale-down window holds them
    out = capsys.readouterr().out
    assert "odd:default replicas=3" in out and "nan" not in out
