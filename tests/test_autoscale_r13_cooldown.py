"""`conveyor autoscale`'s step to zero, tick by tick on a real Valkey: KEDA's cooldownPeriod
gates it, however the pool lost its workers meanwhile."""

from __future__ import annotations

import redis

from tests.test_local_autoscaler import CrashingLedger, _queue, _scaler


def test_a_worker_that_dies_within_the_cooldown_is_replaced_until_it_ends(
    redis_client: redis.Redis,
) -> None:
    """The pool's one worker died (killed for memory) right after its job, the queue empty: the
    pool went to zero at once, the cooldown skipped, and the next job waited for a cold start.
    It is replaced after its backoff, as Kubernetes restarts the pod of a ScaledObject that
    KEDA keeps at one replica until the cooldown ends; an autoscaler that never saw work starts
    nothing."""
    ledger = CrashingLedger(crashing=False)
    scaler = _scaler(ledger, window_s=0.0, cooldown_s=60.0)
    fresh = _scaler(CrashingLedger(crashing=False))
    _queue(redis_client, 0)
    assert fresh.tick(redis_client, now=0.0) == 0
    fresh.release(redis_client)
    _queue(redis_client, 1)
    assert scaler.tick(redis_client, now=0.0) == 1
    _queue(redis_client, 0)
    ledger.crashing = True
    assert scaler.tick(redis_client, now=2.0) == 0
    assert scaler.held.startswith("backing off 0.5s more"), scaler.held
    ledger.crashing = False
    assert [scaler.tick(redis_client, now=t) for t in (3.0, 59.0, 60.0)] == [1, 1, 0]
    assert len(ledger.started) == 2 and ledger.stopped == ledger.started[1:]
