"""The one client every process opens (shared/redis_client.connect), on a real Valkey: its
commands are packed by hiredis in C and reach the server as redis-py's own encoder would send
them, and written in the turn they are sent; a script call outlives a server that lost its
scripts; a burst past its pool waits its turn."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from kombu import Connection
from redis._parsers.encoders import Encoder
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, OutOfMemoryError, RedisClusterException
from redis.retry import Retry

from conveyor.embedded_valkey import start_embedded_valkey
from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from shared import broker_transport
from shared.celery_broker import _node_url, broker_app, kombu_url
from shared.redis_client import (
    LARGE_ARGUMENT,
    ClusterUnreachable,
    HiredisConnection,
    HiredisUnixConnection,
    ScriptBusy,
    UncontendedPool,
    call_script,
    connect,
    reread_topology,
)
from shared.settings import get_settings
from tests.conftest import until

# What redis-py's asyncio connections encode argument by argument, and hiredis must match.
VALUES: list[str | bytes | int | float | memoryview] = [
    "plain",
    "héllo ✓ 日本",
    b"\x00\xff\r\n binary",
    0,
    -5,
    2**63,
    0.1,
    1e20,
    -3.5e-7,
    memoryview(b"a view"),
    # Past LARGE_ARGUMENT: packed by redis-py's own encoder, each a chunk of its own.
    "é" * (LARGE_ARGUMENT + 1),
    b"\x00" * (LARGE_ARGUMENT + 1),
]


async def test_commands_reach_the_server_as_redis_pys_encoder_sends_them(
    redis_url: str, redis_client: redis.Redis
) -> None:
    client = connect(redis_url, name="packing-test", blocks_ms=0)
    encoder = Encoder("utf-8", "strict", False)
    try:
        async with client.pipeline(transaction=False) as pipe:  # packed as one buffer
            for index, value in enumerate(VALUES):
                pipe.set(f"value:{index}", value)
            await pipe.execute()
        assert await client.execute_command("CONFIG GET", "maxmemory")  # a two-word command
        with pytest.raises(DataError):
            await client.set("refused", None)  # type: ignore[arg-type]
        assert await client.set("after", "still usable")
        stored = [redis_client.get(f"value:{index}") for index in range(len(VALUES))]
        assert stored == [bytes(encoder.encode(value)) for value in VALUES]
        connection = await client.connection_pool.get_connection()
        assert isinstance(connection, HiredisConnection)
        await client.connection_pool.release(connection)
    finally:
        await client.aclose()


def test_a_large_argument_goes_out_as_its_own_chunk_uncopied() -> None:
    """A micro-batch's results are megabytes: hiredis would copy them into one buffer."""
    value = b"x" * (LARGE_ARGUMENT + 1)
    chunks = HiredisConnection().pack_command("SET", "key", value)
    assert any(chunk is value for chunk in chunks)
    assert len(HiredisConnection().pack_command("SET", "key", value[:-1])) == 1  # hiredis's one


def test_a_unix_socket_url_packs_with_hiredis_too() -> None:
    client = connect("unix:///tmp/conveyor-no-such.sock", blocks_ms=0)
    assert client.connection_pool.connection_class is HiredisUnixConnection


async def test_a_script_call_loads_the_script_a_server_lost(
    redis_url: str, redis_client: redis.Redis
) -> None:
    client = connect(redis_url, blocks_ms=0)
    try:
        echo = client.register_script("return ARGV[1] .. redis.call('GET', KEYS[1])")
        redis_client.set("suffix", "!")
        assert await call_script(echo, ["suffix"], ["loaded"]) == b"loaded!"
        redis_client.script_flush()  # as a restarted server without persistence has none
        assert await call_script(echo, ["suffix"], ["again"]) == b"again!"
        assert redis_client.script_exists(echo.sha) == [True]
    finally:
        await client.aclose()


async def test_a_burst_past_the_pool_waits_for_connections_in_turn(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Six commands that each hold a connection for 50 ms, through a pool of two: the ones
    that find the pool exhausted wait (returns hand them connections) rather than fail, and
    once the burst is over the pool takes and returns connections without waiting again."""
    client = connect(redis_url, max_connections=2, blocks_ms=200, timeout_s=2)
    pool = client.connection_pool
    try:
        replies = await asyncio.gather(*(client.blpop([f"empty:{i}"], 0.05) for i in range(6)))
        assert replies == [None] * 6
        assert len(pool._available_connections) == 2 and not pool._in_use_connections
        redis_client.rpush("after", "a", "b")
        assert await client.lpop("after") == b"a"
        assert len(pool._available_connections) == 2 and not pool._in_use_connections
        assert isinstance(pool, UncontendedPool) and pool._waiting == 0  # the fast path again
    finally:
        await client.aclose()


async def test_a_command_waits_while_a_handler_holds_the_pool(redis_url: str) -> None:
    """redis-py's re-authentication and maintenance handlers rewrite a pool under its lock: a
    command taken from the pool meanwhile waits for them (it took a connection mid-rewrite)."""
    client = connect(redis_url, blocks_ms=0)
    pool = cast(UncontendedPool, client.connection_pool)
    try:
        assert await client.ping()  # a connection in the pool, free
        async with pool._lock:
            command = asyncio.ensure_future(client.ping())
            await asyncio.sleep(0.1)
            assert not command.done()
        assert await command
        assert pool._available_connections and not pool._in_use_connections
    finally:
        await client.aclose()


async def test_a_command_is_written_before_what_else_the_loop_has_ready(redis_url: str) -> None:
    """Under Python 3.11 redis-py's write ran as a task of its own, after every callback
    already ready: a producer's first submit of a turn reached Redis after all the others."""
    client = connect(redis_url, max_connections=1, blocks_ms=0)
    order: list[str] = []
    try:
        await client.ping()
        connection = await client.connection_pool.get_connection()
        writer = connection._writer
        write = writer.writelines

        def recorded(data: Any) -> None:
            order.append("written")
            write(data)

        writer.writelines = recorded
        await client.connection_pool.release(connection)
        asyncio.get_running_loop().call_soon(order.append, "ready before it")
        assert await client.set("prompt", "yes")
        assert order == ["written", "ready before it"]
    finally:
        await client.aclose()


def test_the_pipeline_runs_on_a_unix_socket_url(tmp_path: Path) -> None:
    """`CONVEYOR_REDIS_URL=unix://...` reaches every client, Celery's broker included (kombu
    spells it `redis+socket://`, here `conveyor-redis+socket://`; given redis-py's spelling, the
    worker used to exit at start)."""
    socket_path = tmp_path / "valkey.sock"
    stack = Stack.create(tmp_path / "stack", valkey_config={"unixsocket": str(socket_path)})
    stack.env.update(CONVEYOR_REDIS_URL=f"unix://{socket_path}?db=0", CONVEYOR_AUTH="disabled")
    try:
        stack.start_producer(free_port())
        worker = stack.consumer_name(stack.start_worker("identity:default"))
        reply = httpx.post(
            f"{stack.base_url}/v1/models/identity/predict", json={"inputs": {"via": "unix"}}
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"] == {"via": "unix"}
        clients = redis.Redis(unix_socket_path=str(socket_path)).client_list()
        addresses = {c["addr"] for c in clients if c["name"] == worker}
        assert addresses and all(str(socket_path) in a for a in addresses), clients
    finally:
        stack.stop()


def test_kombu_gets_every_url_in_its_own_spelling_on_conveyors_transport() -> None:
    assert kombu_url("unix://user:secret@/run/valkey.sock?db=3") == (
        "conveyor-redis+socket://user:secret@/run/valkey.sock?virtual_host=3"
    )
    assert kombu_url("unix:///run/valkey.sock") == (
        "conveyor-redis+socket:///run/valkey.sock?virtual_host=0"
    )
    assert kombu_url("redis://host:6380/2;redis://other:6381/0") == (
        "conveyor-redis://host:6380/2;conveyor-redis://other:6381/0"
    )
    # TLS verifies the server as redis-py does, unless the URL says otherwise
    assert kombu_url("rediss://:pw@host:6380/0") == (
        "conveyor-redis://:pw@host:6380/0?ssl_cert_reqs=required"
    )
    assert kombu_url("rediss://host/0?ssl_cert_reqs=none") == (
        "conveyor-redis://host/0?ssl_cert_reqs=none"
    )


@pytest.mark.parametrize(
    ("url", "tls"),
    [("redis://host:6380/2", None), ("rediss://host:6380/0", {"ssl_cert_reqs": ssl.CERT_REQUIRED})],
)
def test_celerys_broker_connection_is_on_conveyors_transport(
    url: str, tls: dict[str, Any] | None
) -> None:
    """Celery's connection, as a worker makes it, uses the transport whose channels close whole
    (`shared.broker_transport`), and TLS where the URL asks for it."""
    connection = broker_app(url).connection_for_write()
    assert connection.transport_cls == "conveyor-redis"
    assert isinstance(connection.transport, broker_transport.Transport)
    assert (connection.hostname, connection.port, connection.ssl or None) == ("host", 6380, tls)


@pytest.mark.parametrize(
    ("host", "netloc"), [("fd00::2", "[fd00::2]:7001"), ("10.0.0.2", "10.0.0.2:7001")]
)
def test_a_cluster_node_s_broker_url_is_one_kombu_can_read(host: str, netloc: str) -> None:
    url = _node_url("redis://:pw@[fd00::1]:6379/0", ClusterNode(host, 7001))
    assert url == f"redis://:pw@{netloc}/0"
    assert urlsplit(url).port == 7001


@pytest.fixture
def cluster_mode(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")


@pytest.mark.usefixtures("cluster_mode")
async def test_a_cluster_no_node_of_which_answers_is_an_outage() -> None:
    """redis-py says so with a RedisClusterException, no RedisError: what callers map to 503
    or back off from was a 500, and a worker's exit."""
    client = connect(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(ClusterUnreachable):
            await client.ping()
        pipe = client.pipeline()
        pipe.get("k")
        with pytest.raises(RedisConnectionError):
            await pipe.execute()
        with pytest.raises(RedisConnectionError):
            await reread_topology(client)
    finally:
        await client.aclose()


@pytest.mark.usefixtures("cluster_mode")
async def test_a_cluster_url_of_a_server_that_is_no_cluster_node_is_no_outage(
    redis_url: str,
) -> None:
    """A misconfiguration fails as itself: taken for an outage, producers answered 503 and
    workers backed off for good instead of failing at start."""
    client = connect(redis_url)
    try:
        with pytest.raises(RedisClusterException, match="Cluster mode is not enabled") as raised:
            await client.ping()
        assert not isinstance(raised.value, RedisConnectionError)
    finally:
        await client.aclose()


@pytest.mark.usefixtures("cluster_mode")
async def test_a_producer_whose_cluster_is_down_starts_unready_and_answers_503() -> None:
    """It crashed at startup (its consumer groups' creation raised past `except RedisError`),
    and once up every request of an outage was a 500 with a traceback."""
    settings = get_settings().model_copy(
        update={"redis_url": f"redis://127.0.0.1:{free_port()}/0", "auth": "disabled"}
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            ready = await client.get("/readyz")
            submit = await client.post("/v1/jobs", json={"model": "identity", "inputs": {}})
            metrics = await client.get("/metrics")
    assert ready.status_code == 503, ready.text
    assert submit.status_code == 503 and "Retry-After" in submit.headers, submit.text
    assert metrics.status_code == 200


def test_a_server_busy_with_a_slow_script_is_an_outage_to_wait_out(redis_url: str) -> None:
    """BUSY (a script past its time limit) was a plain ResponseError, which ended a worker's
    consumer; a connection error, it is backed off and retried like an outage."""
    admin = redis.Redis.from_url(redis_url)
    threshold = admin.config_get("busy-reply-threshold")["busy-reply-threshold"]
    admin.config_set("busy-reply-threshold", 50)
    looping = threading.Thread(
        target=lambda: _ignore_killed(redis.Redis.from_url(redis_url).eval, "while true do end", 0)
    )
    looping.start()
    try:
        asker = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 0))
        until(lambda: _busy(asker), 10)
        with pytest.raises(ScriptBusy) as busy:
            asker.get("anything")
        assert isinstance(busy.value, RedisConnectionError)
    finally:
        until(lambda: _killed(admin), 10)
        looping.join(10)
        admin.config_set("busy-reply-threshold", threshold)


def _busy(client: redis.Redis) -> bool:
    try:
        client.get("anything")
    except ScriptBusy:
        return True
    return False


def _killed(admin: redis.Redis) -> bool:
    try:
        admin.script_kill()
    except redis.ResponseError:  # NOTBUSY: not yet running, or gone
        return False
    return True


def _ignore_killed(call: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(redis.ResponseError):  # the script killed
        call(*args)


async def _set_once(url: str) -> None:
    producers = connect(url)
    try:
        await producers.set("k", "v")
    finally:
        await producers.aclose()


def test_a_redis_at_its_maxmemory_is_an_outage_to_kombu_and_a_refusal_to_the_producer(
    tmp_path: Path,
) -> None:
    """kombu called a plain OutOfMemoryError unrecoverable: a worker whose Celery consumer started
    at maxmemory (its pidbox binding, its visibility sweep: writes) ended. On kombu's connections
    OOM is a connection error, which Celery's consumer waits out; the producer's own clients
    do not count it as one: its refusal is a 503 (tests/test_faults.py), not a lost connection
    retried."""
    server = start_embedded_valkey(tmp_path / "valkey")  # its own: maxmemory is server-wide
    client = redis.Redis.from_url(server.connection_url)
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        with Connection(kombu_url(server.connection_url)) as connection:
            channel = connection.default_channel
            recoverable = connection.recoverable_connection_errors
            with pytest.raises(recoverable, match="maxmemory"):
                channel.qos.restore_visible()  # its lock: a SET
            channel.exchange_declare("x", "direct")  # kept in the process: no write
            with pytest.raises(recoverable, match="maxmemory"):  # a MULTI's SADD
                channel.queue_bind("q", "x", "q")
        with pytest.raises(OutOfMemoryError) as plain:
            asyncio.run(_set_once(server.connection_url))
        assert not isinstance(plain.value, RedisConnectionError)
    finally:
        client.config_set("maxmemory", 0)
        client.close()
        server.stop()
