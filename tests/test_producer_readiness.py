"""Readiness means the producer can take a job, on real processes: a producer started while its
Redis is away stays alive (`/healthz` 200, nothing for an orchestrator to restart) and unready,
and says ready only once the Redis-side startup it skipped has run: consumer groups (KEDA
measures their lag before any worker runs), admission's scripts loaded, its reply channels
subscribed and the live routes read. It said ready at the first PING Redis answered, its
startup work skipped for good."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.stack import Stack, free_port
from producer_api.health.startup import Startup
from producer_api.jobs import admission
from shared import job_scripts
from shared.keys import GROUP, Keys
from tests.conftest import until, until_async


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:  # not listening yet
        return None


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _groups(client: redis.Redis, stream: str) -> list[str]:
    try:
        return [group["name"].decode() for group in client.xinfo_groups(stream)]
    except redis.ResponseError:  # no such key: the stream was never made
        return []


def test_a_producer_started_without_redis_is_ready_once_its_startup_ran(tmp_path: Path) -> None:
    pipeline = Stack.create(tmp_path)
    pipeline.env["CONVEYOR_AUTH"] = "disabled"
    try:
        pipeline.stop_process("valkey")
        base_url = f"http://127.0.0.1:{free_port()}"
        pipeline.start_producer_process(int(base_url.rsplit(":", 1)[1]))
        until(lambda: _status(f"{base_url}/healthz") == 200, pipeline.start_timeout_s)
        assert _status(f"{base_url}/readyz") == 503

        pipeline.spawn_valkey()
        until(lambda: _status(f"{base_url}/readyz") == 200, 60)
        client = pipeline.client()
        scripts = [*job_scripts.ALL, *admission.SCRIPTS]
        assert all(client.script_exists(*[_sha(script) for script in scripts]))
        keys = Keys(pipeline.settings.key_prefix)
        assert _groups(client, keys.queue("identity", "default")) == [GROUP]
        client.close()
    finally:
        pipeline.stop()


def test_a_partition_key_of_another_type_leaves_the_others_served(tmp_path: Path) -> None:
    """A key of another type where a partition's stream belongs (an operator's slip): its
    refusal was logged as "redis not reachable" and the rest of the startup skipped, and then
    kept every producer unready (every model's requests refused) until the key was mended. That
    partition is left out, named in the log; the rest of the startup runs and the producer is
    ready for the others."""
    pipeline = Stack.create(tmp_path)
    pipeline.env["CONVEYOR_AUTH"] = "disabled"
    try:
        keys = Keys(pipeline.settings.key_prefix)
        stream = keys.queue("identity", "default")
        client = pipeline.client()
        client.set(stream, "not a stream")
        port = free_port()
        pipeline.start_producer_process(port)
        until(lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200, pipeline.start_timeout_s)
        assert _groups(client, keys.queue("identity", "canary")) == [GROUP]
        assert _groups(client, keys.bulk_queue("identity", "default")) == [GROUP]
        scripts = [*job_scripts.ALL, *admission.SCRIPTS]
        assert all(client.script_exists(*[_sha(script) for script in scripts]))
        assert f"{stream} holds no stream" in pipeline.log_path("producer").read_text()
        client.close()
    finally:
        pipeline.stop()


async def test_a_startup_retried_in_the_background_outlives_an_error_of_another_kind() -> None:
    """A try that failed otherwise than by Redis ended the retries for good, the producer
    unready in silence; it is logged and tried again, and the open probe names its class, not
    its message (which may quote what was read)."""
    failures: list[Exception] = [RedisConnectionError("refused"), ValueError("a bad route")]
    startup = Startup()
    reasons: list[str | None] = []  # why unready, as each try began

    async def steps() -> None:
        reasons.append(startup.unready())
        if failures:
            raise failures.pop(0)

    await startup.run(steps)
    try:
        await until_async(lambda: _done(startup))
    finally:
        await startup.stop()
    assert reasons[-1] == "ValueError"


async def _done(startup: Startup) -> bool:
    return startup.unready() is None
