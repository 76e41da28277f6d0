"""A receiver's slow 4xx holds no origin: one tenant's bad URL on a shared receiver (Slack, a
common gateway) answered 404 after a tenth of the timeout or more, and the whole origin was held
six times that long, every other tenant's deliveries there waiting it out. A 4xx fails at once
and is never retried, and a receiver that answers is not overloaded. On a real local receiver
and a real Valkey."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.local_http import LocalServer, QuietHandler, serving
from tests.test_webhook_timeouts import EVENT
from tests.webhook_receiver import delivering_to
from workers import webhook_delivery


class _SharedReceiver(QuietHandler):
    """Answers `/<tenant>/<status>` with that status, a 4xx after 0.3 s (slowly)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = int(self.path.rsplit("/", 1)[-1])
        if 400 <= status < 500:
            time.sleep(0.3)
        self.answer(status, b"")


@pytest.fixture
def shared_receiver() -> Iterator[LocalServer]:
    with serving(LocalServer(_SharedReceiver)) as server:
        yield server


def test_a_slow_4xx_for_one_url_holds_no_other_delivery_to_its_origin(
    shared_receiver: LocalServer,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origin = shared_receiver.url
    keys = delivering_to(origin, "r27-holds:", redis_client, settings_env, monkeypatch)
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1")
    deliveries = {"bad": f"{origin}/tenant-a/404", "good": f"{origin}/tenant-b/200"}
    statuses = {}
    for job_id, url in deliveries.items():
        redis_client.hset(keys.job(job_id), "status", "succeeded")
        statuses[job_id] = webhook_delivery.deliver_webhook.run(
            "job", job_id, url, EVENT, time.time()
        )
    assert statuses == {"bad": "failed", "good": "delivered"}
    (refused,) = json.loads(redis_client.hget(keys.job("bad"), "webhook_attempts") or "")
    assert refused["error"] == "HTTP 404" and refused["duration_ms"] >= 300, refused
    assert not redis_client.exists(keys.webhook_hold(origin))
