"""The CLI's blocking client of the stack's Redis (`Stack.client`: `conveyor up`'s readiness looks,
`conveyor autoscale`'s polls and pool leases), through a real proxy to a real Valkey that loses
one reply after the server ran the command: redis-py's `from_url` client sent nothing again, so
the blip failed the command (a poll's "redis unavailable", the lease's release left to lapse).
It is sent again now; every command it carries is safe to run twice, the leases' scripts too (a
lease taken, then renewed by its owner; a release that finds the lease gone does nothing)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from autoscaling.local_autoscaler import PoolScaler
from autoscaling.scaling_math import StreamTrigger
from conveyor.commands.autoscale import _release_leases
from conveyor.stack import Stack
from shared import leader_lock
from shared.keys import Keys
from tests.reply_dropper import ReplyDropper, served_in_thread

LEASE_KEY = Keys("cv:").autoscale_leader("r38", "default")
STREAM = "r38-resends"


def _sha(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


@contextmanager
def _stack_through(proxy: ReplyDropper, log_dir: Path) -> Iterator[redis.Redis]:
    """The stack's client (`Stack.client`) reaching Redis through `proxy`, which runs on a loop of
    its own thread (the client blocks)."""
    with served_in_thread(proxy) as url:
        client = Stack.create(log_dir, url).client()
        try:
            yield client
        finally:
            client.close()


def _dropping(redis_url: str, script: str) -> ReplyDropper:
    """A proxy that loses the reply to the first run of `script` (loaded first: the run the
    server made is the one whose reply is lost, not a NOSCRIPT)."""
    with redis.Redis.from_url(redis_url) as loader:
        loader.script_load(script)
    url = urlparse(redis_url)
    return ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379, _sha(script))


def _scaler() -> PoolScaler:
    """A pool of 0 to 2 replicas on one `streamLength` trigger, its workers only named."""
    trigger = StreamTrigger.from_metadata({"stream": STREAM, "streamLength": "64"})
    return PoolScaler(
        "r38:default",
        [trigger],
        0,
        2,
        60.0,
        0.0,
        start_worker=lambda name: name,
        stop_workers=lambda names: None,
        alive=lambda name: True,
        lease_key=LEASE_KEY,
        lease_ms=60_000,
    )


@pytest.fixture
def scaler(redis_client: redis.Redis) -> PoolScaler:
    """A pool with one job queued, its lease free."""
    redis_client.xadd(STREAM, {"job": "x"})
    return _scaler()


def test_a_poll_whose_lease_reply_was_lost_takes_the_lease_and_scales(
    redis_url: str, redis_client: redis.Redis, scaler: PoolScaler, tmp_path: Path
) -> None:
    """The lease's SET NX ran, its reply lost: run again, its owner's second run renews it."""
    proxy = _dropping(redis_url, leader_lock._HOLD)
    with _stack_through(proxy, tmp_path) as client:
        assert scaler.tick(client, now=0.0) == 1
    assert proxy.dropped == 1
    assert scaler.leading
    assert redis_client.get(LEASE_KEY) == scaler.owner.encode()


def test_a_release_whose_reply_was_lost_frees_the_pool(
    redis_url: str,
    redis_client: redis.Redis,
    scaler: PoolScaler,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The release's DEL ran, its reply lost: run again, it finds no lease of its owner's and
    does nothing; the stop says nothing of leases left to lapse."""
    with redis.Redis.from_url(redis_url) as direct:
        scaler.tick(direct, now=0.0)
    proxy = _dropping(redis_url, leader_lock._RELEASE)
    with _stack_through(proxy, tmp_path) as client:
        _release_leases([scaler], client)
    assert proxy.dropped == 1
    assert "left to lapse" not in capsys.readouterr().err
    assert not scaler.leading
    assert redis_client.exists(LEASE_KEY) == 0
