"""A receiver held for failing slowly stays held as long as its slowest failure asks: two of its
deliveries fail at once on two of a worker's threads, one after running out the timeout (held
six times that) and one soon after a quicker 500 (held six times less); the quicker one's hold
replaced the longer one, and the receiver that hangs was tried again within a second. On a real
local receiver and a real Valkey."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from shared.keys import Keys
from tests.local_http import LocalServer, QuietHandler, serving
from tests.test_webhook_timeouts import EVENT
from workers import webhook_delivery
from workers.webhook_delivery import ReceiverHolds, _post


class _SlowFailure(QuietHandler):
    """Answers a 500 after the seconds its path's last segment names."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(float(self.path.rsplit("/", 1)[-1]))
        self.answer(500, b"")


@pytest.fixture
def failing() -> Iterator[LocalServer]:
    with serving(LocalServer(_SlowFailure)) as server:
        yield server


def test_a_quicker_failure_does_not_shorten_a_receivers_hold(
    failing: LocalServer,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1", CONVEYOR_WEBHOOK_SECRET="whsec-test")
    holds = ReceiverHolds(lambda: redis_client, Keys("r25-holds:"))
    monkeypatch.setattr(webhook_delivery, "_receiver_holds", lambda: holds)
    # the two attempts were in flight together: the quick one ends after the slow one
    slow = _post(f"{failing.url}/hooks/1.5", b"{}", EVENT)
    quick = _post(f"{failing.url}/hooks/0.2", b"{}", EVENT)
    assert slow["error"].startswith("TimeoutError") and quick["error"] == "HTTP 500"
    assert holds.left_s(failing.url) > 6 * quick["duration_ms"] / 1000 + 1  # the slow one's
