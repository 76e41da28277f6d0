"""An attempt's claim (`workers/webhook_delivery.py`, `_claimed_before` and `_keep_claim`) with
no task id or with its Redis out of reach: never raised (the delivery would be dropped), the
attempt sent, each logged with what it costs. The claims on a reachable Redis are exercised in
tests/test_webhook_timeouts.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from workers import webhook_delivery


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """A real client to a port nothing listens on: every command fails to connect."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, socket_timeout=0.5)
    monkeypatch.setattr(webhook_delivery, "_redis", lambda: client)
    yield client
    client.close()


def test_an_unclaimed_attempt_is_sent_anyway_and_logged(
    unreachable: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert webhook_delivery._claimed_before("task-u1", 3) is False
    (record,) = caplog.records
    assert record.getMessage().startswith("webhook attempt task-u1/3 not claimed, sent anyway: ")


def test_a_claim_not_kept_is_logged_not_raised(
    unreachable: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    assert webhook_delivery._keep_claim("task-u2", 1) is None
    (record,) = caplog.records
    assert record.getMessage().startswith("webhook attempt task-u2/1 claim not kept: ")


def test_a_direct_call_has_no_claim(
    unreachable: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """No task id, no copy to race: Redis is not asked (its failure would be logged)."""
    assert webhook_delivery._claimed_before(None, 0) is False
    webhook_delivery._keep_claim(None, 0)
    assert caplog.records == []
