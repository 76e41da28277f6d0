"""An attempt's claim (`workers/webhook_delivery.py`, `_claimed_before` and `_keep_claim`) with
no task id or with its Redis out of reach: never raised (the delivery would be dropped), the
attempt sent, each logged with what it costs; and a claim whose reply was lost, sent again by
redis-py, which must find itself, not another copy. The claims' life on a reachable Redis is
exercised in tests/test_webhook_timeouts.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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


class ResentSet:
    """A real client whose SET reaches Redis twice, the second reply answered: redis-py sending
    the command again after the first one ran and its reply was lost."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def set(self, *args: Any, **kwargs: Any) -> Any:
        self.client.set(*args, **kwargs)
        return self.client.set(*args, **kwargs)


def test_a_claim_sent_again_after_its_reply_was_lost_is_still_ours(
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SET NX sent again found the key it had just written: the attempt was taken for
    another copy's, returned "duplicate" and was acknowledged, the webhook never sent. A real
    second copy still finds the attempt taken."""
    settings_env(CONVEYOR_KEY_PREFIX="resent-claim:")
    monkeypatch.setattr(webhook_delivery, "_redis", lambda: ResentSet(redis_client))
    assert webhook_delivery._claimed_before("task-r1", 0) is False
    monkeypatch.setattr(webhook_delivery, "_redis", lambda: redis_client)
    assert webhook_delivery._claimed_before("task-r1", 0) is True
