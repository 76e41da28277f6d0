"""The webhook attempt log on a real Valkey: attempts append in order on the hash of the job or
batch, its TTL untouched, and a hash that is gone (expired before or during a record) is never
brought back as a key with no TTL; an attempt Redis would not record still leaves the event to
retry."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from celery.exceptions import Retry
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from conveyor.stack import free_port
from shared.settings import get_settings
from workers import webhook_delivery
from workers.webhook_delivery import AttemptLog

KEY = "test:webhook-attempts:job"


def test_attempts_append_in_order_and_keep_the_hash_ttl(redis_client: redis.Redis) -> None:
    redis_client.delete(KEY)
    redis_client.hset(KEY, "status", "succeeded")
    redis_client.expire(KEY, 600)
    log = AttemptLog(redis_client)
    assert log.record(KEY, {"attempt": 1, "error": "HTTP 500", "score": 0.5}, "retrying")
    assert log.record(KEY, {"attempt": 2, "error": None}, "delivered")
    fields = redis_client.hgetall(KEY)
    assert json.loads(fields[b"webhook_attempts"]) == [
        {"attempt": 1, "error": "HTTP 500", "score": 0.5},
        {"attempt": 2, "error": None},
    ]
    assert fields[b"webhook_status"] == b"delivered"
    assert fields[b"status"] == b"succeeded"
    assert 0 < redis_client.ttl(KEY) <= 600


def test_a_gone_hash_is_not_brought_back(redis_client: redis.Redis) -> None:
    redis_client.delete(KEY)
    assert not AttemptLog(redis_client).record(KEY, {"attempt": 1}, "delivered")
    assert redis_client.exists(KEY) == 0


class _ExpiresBeforeEachWrite(redis.Redis):
    """A client under which the hash expires just before any command that writes: the window
    a read-then-write across round trips leaves open."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in {"HSET", "EVALSHA", "EVAL"}:
            super().execute_command("DEL", KEY)
        return super().execute_command(*args, **options)


def test_a_hash_that_expires_during_a_record_stays_gone(redis_url: str) -> None:
    client = _ExpiresBeforeEachWrite.from_url(redis_url)
    try:
        client.hset(KEY, "status", "succeeded")
        client.expire(KEY, 600)
        assert not AttemptLog(client).record(KEY, {"attempt": 1}, "delivered")
        assert client.exists(KEY) == 0
    finally:
        client.close()


def test_an_attempt_not_recorded_still_retries(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Recording an attempt is bookkeeping: a Redis error there escaped the task, which Celery
    acknowledged, so a failed delivery was never tried again."""
    receiver = f"http://127.0.0.1:{free_port()}"  # nothing listens: the attempt fails
    monkeypatch.setenv("CONVEYOR_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("CONVEYOR_WEBHOOK_ALLOWLIST", receiver)
    get_settings.cache_clear()
    gone = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=RedisRetry(NoBackoff(), 0))
    monkeypatch.setattr(webhook_delivery, "_attempt_log", lambda: AttemptLog(gone))
    try:
        with pytest.raises(Retry):
            webhook_delivery.deliver_webhook.run(
                "job", "j1", f"{receiver}/hook", {"id": "e1"}, time.time()
            )
    finally:
        get_settings.cache_clear()
    assert "webhook attempt on job j1 not recorded" in caplog.text
