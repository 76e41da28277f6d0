"""A frozen cluster master (SIGSTOP: its connections stay open, nothing answers) costs a command
one socket timeout, as a frozen single server does, and the command is sent once. redis-py's
cluster client retried timeouts three times more, whatever the client's `Retry` said (a
command, a pipeline, a transaction): a 503 four timeouts late, and commands sent again that
the master ran anyway once it woke (a TAKE run twice: entries pending that nobody holds)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.valkey_cluster import ClusterNode, LocalCluster, local_cluster
from shared.redis_client import HiredisPacking, RedisClient, connect

pytestmark = pytest.mark.slow
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def steady(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """No replicas and no failure detection within a test: a frozen master keeps its slots, so
    every try goes to it."""
    root = tmp_path_factory.mktemp("steady")
    with local_cluster(root, replicas=0, node_timeout_ms=60_000) as formed:
        yield formed


@pytest.fixture
async def client(
    steady: LocalCluster, settings_env: Callable[..., None]
) -> AsyncIterator[RedisClient]:
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    url = f"redis://127.0.0.1:{steady.masters[0].port}/0"
    made = connect(url, blocks_ms=0, timeout_s=TIMEOUT_S)
    yield made
    await made.aclose()


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The arguments of every command a node's connection packs: one entry per try."""
    commands: list[tuple[Any, ...]] = []
    pack = HiredisPacking.pack_command

    def counted(self: HiredisPacking, *args: Any) -> list[bytes]:
        commands.append(args)
        return pack(self, *args)

    monkeypatch.setattr(HiredisPacking, "pack_command", counted)
    return commands


@contextmanager
def frozen(node: ClusterNode) -> Iterator[None]:
    """The node stopped, and always continued on the way out."""
    pid = node.pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _key_off_startup_node(cluster: LocalCluster) -> str:
    """A key another master than the client's startup node serves: topology reads answer."""
    keys = (f"cv:test:{{{tag}}}" for tag in range(100))
    return next(k for k in keys if cluster.master_of(k).port != cluster.masters[0].port)


async def _command(client: RedisClient, key: str) -> None:
    await client.incr(key)


async def _pipeline(client: RedisClient, key: str) -> None:
    async with client.pipeline(transaction=False) as pipe:
        pipe.incr(key)
        await pipe.execute()


async def _transaction(client: RedisClient, key: str) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        await pipe.execute()


@pytest.mark.parametrize("send", [_command, _pipeline, _transaction])
async def test_a_frozen_master_times_out_after_one_try(
    steady: LocalCluster,
    client: RedisClient,
    packed: list[tuple[Any, ...]],
    send: Callable[[RedisClient, str], Awaitable[None]],
) -> None:
    key = _key_off_startup_node(steady)
    await client.ping()  # the topology known before the freeze
    with frozen(steady.master_of(key)), pytest.raises(RedisTimeoutError):
        await send(client, key)
    assert sum(key in args for args in packed) == 1
