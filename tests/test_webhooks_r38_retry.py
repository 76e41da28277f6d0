"""The webhook worker's blocking client on one server, through a real proxy to a real Valkey
that loses the reply to its record of an attempt after the server ran it: redis-py's `from_url`
client sent nothing again, so the record failed on a blip and was logged "not recorded" though
the attempt stood on the hash. It is sent again now (the record adds nothing the second time),
and a record that still fails says what is known: recorded or not, unknown, once a try may have
run; "not recorded" only where no try reached the server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import pytest
import redis

from shared.keys import Keys
from shared.settings import get_settings
from tests.reply_dropper import ReplyDropper, served_in_thread
from workers import webhook_delivery

MARKER = hashlib.sha1(webhook_delivery._APPEND_ATTEMPT.encode()).hexdigest().encode()


class _DropsThenCloses(ReplyDropper):
    """Loses the record's reply, then takes no connection: Redis gone for the tries after."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await super()._serve(reader, writer)
        if self.dropped:
            await self.stop()  # before the client reads the end of its connection


@contextmanager
def _worker_through(proxy: ReplyDropper, settings_env: Callable[..., None]) -> Iterator[None]:
    """The webhook worker's own client (`_redis`) reaching Redis through `proxy`, which runs on
    a loop of its own thread (the client blocks)."""
    with served_in_thread(proxy) as url:
        settings_env(CONVEYOR_REDIS_URL=url, CONVEYOR_REDIS_CLUSTER="0")
        clients = (webhook_delivery._redis, webhook_delivery._attempt_log)
        for cache in clients:
            cache.cache_clear()
        try:
            yield
        finally:
            webhook_delivery._redis().close()
            for cache in clients:
                cache.cache_clear()


def _job(redis_client: redis.Redis) -> tuple[str, str]:
    """A job's id and hash key, the record's script loaded (the reply lost is the run's)."""
    redis_client.script_load(webhook_delivery._APPEND_ATTEMPT)
    job_id = f"r38-{uuid.uuid4().hex[:8]}"
    key = Keys(get_settings().key_prefix).job(job_id)
    redis_client.hset(key, "status", "succeeded")
    return job_id, key


ATTEMPT: dict[str, Any] = {"attempt": 1, "at": 12.5, "status_code": 500, "error": "HTTP 500"}


def _proxy(redis_url: str, kind: type[ReplyDropper]) -> ReplyDropper:
    url = urlparse(redis_url)
    return kind(url.hostname or "127.0.0.1", url.port or 6379, MARKER)


def test_an_attempt_whose_reply_was_lost_is_recorded_once(
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    job_id, key = _job(redis_client)
    proxy = _proxy(redis_url, ReplyDropper)
    with _worker_through(proxy, settings_env):
        webhook_delivery._record("job", job_id, ATTEMPT, "retrying")
        assert proxy.dropped == 1
    assert "webhook attempt" not in caplog.text
    assert json.loads(redis_client.hget(key, "webhook_attempts") or b"[]") == [ATTEMPT]
    assert redis_client.hget(key, "webhook_status") == b"retrying"


def test_a_record_that_ran_then_lost_redis_is_not_logged_as_unrecorded(
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tries after the lost reply meet a connection refused: the last error alone said
    nothing was sent, while the first try's record stands."""
    job_id, key = _job(redis_client)
    proxy = _proxy(redis_url, _DropsThenCloses)
    with _worker_through(proxy, settings_env):
        webhook_delivery._record("job", job_id, ATTEMPT, "retrying")
        assert proxy.dropped == 1
    assert json.loads(redis_client.hget(key, "webhook_attempts") or b"[]") == [ATTEMPT]
    assert f"webhook attempt on job {job_id} recorded or not, unknown" in caplog.text
    assert "not recorded" not in caplog.text
