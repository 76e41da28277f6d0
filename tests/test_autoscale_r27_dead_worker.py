"""`conveyor autoscale` on a real Valkey, a worker of a scaled pool dying: Kubernetes restarts
the pod, and the HPA goes on from the Deployment's count. The autoscaler took the count of the
workers left instead, and the HPA's 10 % tolerance then kept it: 200 entries at 64 a replica
are four replicas' worth, but within 10 % of three, so the dead worker was never replaced."""

from __future__ import annotations

import redis

from tests.test_local_autoscaler import Ledger, _queue, _scaler


def test_a_dead_worker_is_replaced_when_the_rest_are_within_tolerance(
    redis_client: redis.Redis,
) -> None:
    ledger = Ledger()
    scaler = _scaler(ledger, window_s=60.0)
    _queue(redis_client, 256)
    assert scaler.tick(redis_client, now=0.0) == 4
    _queue(redis_client, 200)
    assert scaler.tick(redis_client, now=1.0) == 4  # ceil(200 / 64): it keeps its four
    ledger.stopped.append(ledger.started[0])  # died, killed for memory, after 100 s up
    assert scaler.tick(redis_client, now=100.0) == 3  # counted out; its backoff (0.5 s) runs
    assert scaler.tick(redis_client, now=101.0) == 4  # it was 3 for good
    assert len(ledger.started) == 5
