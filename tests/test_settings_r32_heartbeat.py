"""A worker's heartbeat period and its record's TTL are settings (CONVEYOR_WORKER_HEARTBEAT_S,
CONVEYOR_WORKER_HEARTBEAT_TTL_S; 2 s and 10 s by default): a worker beats that often and its
record, hence its place among the live workers the producer reads, expires that long after its
last beat. A TTL not past the period is refused as the process starts: a live worker's record
would lapse between its beats."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from shared.keys import Keys
from shared.redis_client import connect
from shared.settings import Settings, bad_setting, settings_or_exit
from shared.worker_registry import TTL_S, WorkerRegistry
from tests.conftest import REPO_ROOT, own_valkey, until
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.heartbeat import _Beater

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
PERIOD_S, SHORT_TTL_S = 0.2, 2
# Beats counted against a witness key living WITNESS_PERIODS default periods, 7 s: BEATS of them
# at the default period take more (BEATS - 2 periods at least, the first late on its cadence,
# less half a period for a beat's own time); at PERIOD_S ~1.2 s, so a test stalled ~5 s on a
# loaded machine still sees them all within the witness's life.
BEATS = 6
WITNESS_PERIODS = BEATS - 2.5
DEFAULT_PERIOD_S: float = Settings.model_fields["worker_heartbeat_s"].default


@pytest.fixture(scope="module")
def own_redis_url() -> Iterator[str]:
    """One server for this module's beaters (each test empties it)."""
    with own_valkey() as url:
        yield url


@pytest.fixture
def client(own_redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis_url) as plain:
        plain.flushdb()
        yield plain


def test_the_defaults_are_as_before() -> None:
    settings = Settings()
    assert (settings.worker_heartbeat_s, settings.worker_heartbeat_ttl_s) == (2.0, 10)
    assert TTL_S == 10  # what a registry writes when not told


@pytest.mark.parametrize(("period", "ttl"), [("3", "3"), ("5", "3"), ("2.5", "2")])
def test_a_ttl_not_past_the_period_is_refused_at_start(
    settings_env: Callable[..., None], period: str, ttl: str
) -> None:
    settings_env(CONVEYOR_WORKER_HEARTBEAT_S=period, CONVEYOR_WORKER_HEARTBEAT_TTL_S=ttl)
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = bad_setting(refused.value)
    assert f"CONVEYOR_WORKER_HEARTBEAT_TTL_S={ttl!r}" in line, line
    assert "must be longer than CONVEYOR_WORKER_HEARTBEAT_S" in line, line
    # what `celery -A workers.app` and the producer's entry module end with: one line, no trace
    with pytest.raises(SystemExit) as exited:
        settings_or_exit()
    assert str(exited.value) == f"Error: {line}"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CONVEYOR_WORKER_HEARTBEAT_S", "0"),
        ("CONVEYOR_WORKER_HEARTBEAT_S", "-1"),
        ("CONVEYOR_WORKER_HEARTBEAT_TTL_S", "0"),
        ("CONVEYOR_WORKER_HEARTBEAT_TTL_S", "1.5"),  # an EXPIRE's whole seconds
    ],
)
def test_out_of_bounds_values_are_refused(
    settings_env: Callable[..., None], name: str, value: str
) -> None:
    settings_env(**{name: value})
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert f"{name}={value!r}" in bad_setting(refused.value)


def test_a_ttl_just_past_the_period_is_taken(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_WORKER_HEARTBEAT_S="0.5", CONVEYOR_WORKER_HEARTBEAT_TTL_S="1")
    assert (Settings().worker_heartbeat_s, Settings().worker_heartbeat_ttl_s) == (0.5, 1)


def test_a_worker_beats_with_the_configured_period_and_ttl(
    own_redis_url: str, client: redis.Redis, settings_env: Callable[..., None]
) -> None:
    """The record and the index live the configured TTL, not the default 10 s; the beats come
    every PERIOD_S (BEATS land before the default period could have sent them)."""
    settings_env(
        CONVEYOR_WORKER_HEARTBEAT_S=str(PERIOD_S),
        CONVEYOR_WORKER_HEARTBEAT_TTL_S=str(SHORT_TTL_S),
    )
    settings = Settings(redis_url=own_redis_url, model_repository=FIXTURES, models=["tiny"])
    beater = _Beater(object(), settings)
    record, index = Keys().worker(consumer_name()), Keys().workers
    beater.start()
    try:
        until(lambda: client.exists(record), timeout=30, every=0.01)
        assert 0 < client.ttl(record) <= SHORT_TTL_S
        assert 0 < client.ttl(index) <= SHORT_TTL_S
        # the witness (on Redis's clock) outlives BEATS beats at the configured period only
        client.set("witness", 1, px=int(WITNESS_PERIODS * DEFAULT_PERIOD_S * 1000))
        for _ in range(BEATS):
            client.delete(record)
            until(lambda: client.exists(record), timeout=30, every=0.01)
        assert client.exists("witness"), "the beats did not come at the configured period"
    finally:
        beater.stop()


def _live(redis_url: str) -> list[str]:
    """The live workers' names as the producer reads them (WorkerRegistry.live)."""

    async def read() -> list[str]:
        reader = connect(redis_url, name="r32-reader", blocks_ms=0)
        try:
            return [beat.name for beat in await WorkerRegistry(reader, Keys()).live()]
        finally:
            await reader.aclose()

    return asyncio.run(read())


def test_a_worker_that_stops_beating_reads_as_gone_once_its_ttl_passes(
    own_redis_url: str,
    client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As after a kill -9: no more beats, and nothing removed. The producer's reading (`live`)
    drops the worker once its short TTL passes, while a key given the default TTL just after
    the last beat (a witness, on Redis's clock) still lives: the default would have kept it."""
    settings_env(
        CONVEYOR_WORKER_HEARTBEAT_S=str(PERIOD_S),
        CONVEYOR_WORKER_HEARTBEAT_TTL_S=str(SHORT_TTL_S),
    )
    settings = Settings(redis_url=own_redis_url, model_repository=FIXTURES, models=["tiny"])
    killed, skipped = threading.Event(), threading.Event()
    real_publish = WorkerRegistry.publish

    async def publish_until_killed(registry: WorkerRegistry, *args: Any, **kwargs: Any) -> None:
        if killed.is_set():  # a killed worker writes nothing more
            skipped.set()
            return
        await real_publish(registry, *args, **kwargs)

    monkeypatch.setattr(WorkerRegistry, "publish", publish_until_killed)
    beater = _Beater(object(), settings)
    record = Keys().worker(consumer_name())
    beater.start()
    try:
        until(lambda: client.exists(record), timeout=30, every=0.01)
        assert _live(own_redis_url) == [consumer_name()]
        killed.set()
        # the beats run one after another: once one is skipped, the last has landed
        assert skipped.wait(timeout=30)
        client.set("witness", 1, ex=TTL_S)
        assert client.ttl(record) <= SHORT_TTL_S  # -2 if it is gone already
        until(lambda: _live(own_redis_url) == [], timeout=30, every=0.05)
        assert client.exists("witness"), "the worker outlived the default TTL"
        assert not client.exists(record)
    finally:
        beater.stop()
