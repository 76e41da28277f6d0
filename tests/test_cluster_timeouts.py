"""A frozen cluster master (SIGSTOP: its connections stay open, nothing answers) costs a command
one socket timeout, as a frozen single server does, and the command is sent once. redis-py's
cluster client retried timeouts three times more, whatever the client's `Retry` said (a
command, a pipeline, a transaction): a 503 four timeouts late, and commands sent again that
the master ran anyway once it woke (a TAKE run twice: entries pending that nobody holds).
What the producer reads of a frozen master is an outage too: readiness follows the control
plane's master, partition stats are not read as empty lanes, and a subscription it refused
leaves no listener behind."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import httpx
import pytest
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.valkey_cluster import ClusterNode, LocalCluster, local_cluster
from producer_api.app import create_app
from producer_api.reply_listener import ReplyListener
from shared.backlog import read_backlogs
from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository, Variant
from shared.partition_stats import read_partition_stats
from shared.redis_client import HiredisPacking, RedisClient, connect
from shared.settings import get_settings

pytestmark = pytest.mark.slow
TIMEOUT_S = 1.0
KEYS = Keys()


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


def _off_startup_node(cluster: LocalCluster, key: Callable[[str], str]) -> str:
    """A name whose `key` another master than the client's startup node serves: topology
    reads answer while that master is frozen."""
    names = (f"t{n}" for n in range(100))
    return next(n for n in names if cluster.master_of(key(n)).port != cluster.masters[0].port)


def _test_key(tag: str) -> str:
    return f"cv:test:{{{tag}}}"


def _key_off_startup_node(cluster: LocalCluster) -> str:
    return _test_key(_off_startup_node(cluster, _test_key))


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


async def test_readiness_follows_the_control_planes_master(
    steady: LocalCluster, settings_env: Callable[..., None]
) -> None:
    """`/readyz` PINGed the client's default node (the master of slot 0): ready while the
    master of the control plane's slot (API keys: every authenticated request) was gone, and
    not ready while only another master was."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REDIS_TIMEOUT_S=str(TIMEOUT_S))
    url = f"redis://127.0.0.1:{steady.masters[0].port}/0"
    app = create_app(get_settings().model_copy(update={"redis_url": url, "auth": "disabled"}))
    control = steady.master_of(Keys().api_key_index)
    async with app.router.lifespan_context(app):
        redis = cast(Any, app.state.conveyor.redis)
        assert redis.get_default_node().port != control.port  # else this proves nothing
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            assert (await http.get("/readyz")).status_code == 200
            with frozen(control):
                unready = await http.get("/readyz")
    assert unready.status_code == 503, unready.text


async def test_stats_of_a_frozen_masters_partitions_are_an_outage_not_empty_lanes(
    steady: LocalCluster, client: RedisClient
) -> None:
    """A cluster pipeline returns each node's errors as its commands' replies: they were read
    as 0, and the lag, pending and DLQ gauges of every partition on a master that failed over
    dropped to 0 (clearing their alerts), where one server's outage left them as they were."""
    model = _off_startup_node(steady, lambda name: KEYS.queue(name, "default"))
    repository = ModelRepository({model: ModelConfig(name=model, kind="batch", backend="identity")})
    stream = KEYS.queue(model, "default")
    await client.xgroup_create(stream, GROUP, "0", mkstream=True)
    for n in range(3):
        await client.xadd(stream, {"n": n})
    await client.xadd(KEYS.dlq(model, "default"), {"n": 0})
    [stats] = await read_partition_stats(client, KEYS, repository)
    assert (stats.online.lag, stats.dlq_depth) == (3, 1)
    with frozen(steady.master_of(stream)), pytest.raises(RedisError):
        await read_partition_stats(client, KEYS, repository)


async def test_the_backlog_of_a_frozen_masters_partition_is_an_outage_not_zero(
    steady: LocalCluster, client: RedisClient
) -> None:
    """Read as 0, the backlog gauge and the local autoscaler would scale a pool to zero while
    its master is out: the pipeline raises its nodes' errors instead (shared/backlog.py)."""
    model = _off_startup_node(steady, lambda name: KEYS.queue(name, "b"))
    variants = {"b": Variant()}  # lanes of their own: the module's cluster outlives each test
    config = ModelConfig(
        name=model, kind="batch", backend="identity", variants=variants, default_variant="b"
    )
    stream = KEYS.queue(model, "b")
    for n in range(3):
        await client.xadd(stream, {"n": n})
    [backlog] = await read_backlogs(client, KEYS, [(config, "b")])
    assert backlog.entries == 3
    with frozen(steady.master_of(stream)), pytest.raises(RedisError):
        await read_backlogs(client, KEYS, [(config, "b")])


async def test_a_subscription_a_frozen_master_refused_leaves_no_listener(
    steady: LocalCluster, client: RedisClient
) -> None:
    """The listener's connection to a node and its task were made before its first SSUBSCRIBE
    and kept when that failed (a master dead, not yet failed over): the task woke every 50 ms
    for good, and every failover to a new address added one."""
    channel = KEYS.reply("p1", _off_startup_node(steady, lambda tag: KEYS.reply("p1", tag)))
    listener = ReplyListener(client, KEYS, "p1", JobStore(client, KEYS, 60))
    await client.ping()  # the topology known before the freeze
    try:
        with frozen(steady.master_of(channel)), pytest.raises(RedisError):
            await listener.follow(channel, 0)
        assert not _listening()
        await listener.follow(channel, 0)  # the master back: subscribed anew
        assert len(_listening()) == 1
    finally:
        await listener.stop()


def _listening() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == "reply-listener"]
