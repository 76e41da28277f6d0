"""A receiver is held for six times its failed attempt, but for the timeout at most: a worker
paused mid-attempt (SIGSTOP, a VM migrated) measured the pause as the attempt, and a soak's
20 s stop held a healthy receiver 120 s under a 10 s timeout, every delivery to it recorded
`held` meanwhile. On a real local receiver and a real Valkey."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from tests.test_webhook_timeouts import EVENT, failing_receiver
from tests.webhook_receiver import delivering_to
from workers import webhook_delivery

PAUSE_S = 20.0
# Room for the receiver's thread to stall before it takes the request (at 1 s, a 2 s stall there
# timed the attempt out unpaused); the pause still outlasts it fourfold.
TIMEOUT_S = 5.0


class _PausedClock:
    """The delivery module's `time`, whose monotonic clock jumps PAUSE_S once the receiver took
    the request: the worker's process did not run meanwhile."""

    def __init__(self) -> None:
        self.jump = 0.0

    def pause(self) -> None:
        self.jump = PAUSE_S

    def monotonic(self) -> float:
        return time.monotonic() + self.jump

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_worker_paused_mid_attempt_holds_its_receiver_for_the_timeout_at_most(
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _PausedClock()
    monkeypatch.setattr(webhook_delivery, "time", clock)
    with failing_receiver(0.3, on_take=clock.pause) as (origin, taken):
        keys = delivering_to(origin, "r39-pause:", redis_client, settings_env, monkeypatch)
        settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S=str(TIMEOUT_S))
        for job_id in ("j1", "j2"):
            redis_client.hset(keys.job(job_id), "status", "succeeded")
            with pytest.raises(Retry):
                webhook_delivery.deliver_webhook.run(
                    "job", job_id, f"{origin}/{job_id}", EVENT, time.time()
                )
    assert len(taken) == 1  # the slow failure still holds the receiver
    (failed,) = json.loads(redis_client.hget(keys.job("j1"), "webhook_attempts") or "")
    (held,) = json.loads(redis_client.hget(keys.job("j2"), "webhook_attempts") or "")
    assert failed["duration_ms"] >= PAUSE_S * 1000, failed  # the pause, as the attempt saw it
    assert held["error"].startswith("held:"), held
    assert held["retry_after_s"] <= 6 * TIMEOUT_S, held  # was 6 x 20.3 s
