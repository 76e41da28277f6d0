"""A write the OS ends with ETIMEDOUT (the peer gone: TCP gave up on it) found a connection dead,
not a server slow: redis-py raises a connection error, which its retry sends again on a new
connection (after a failover behind one address: to the new master). A connection `connect`
made bounds its writes itself (`WritesInTurn`) and raised a timeout, which nothing retries."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.stack import Stack
from shared.redis_client import LARGE_ARGUMENT, connect

# Past what loopback buffers take from a frozen server: the write waits on TCP.
WRITTEN_BYTES = 512 * LARGE_ARGUMENT
Frozen = Callable[[float], AbstractAsyncContextManager[AbstractConnection]]


@pytest.fixture
def frozen(bare_stack: Stack) -> Frozen:
    """A connection `connect` made (writes bounded by `timeout_s`) to a server of the test's
    own (the session's serves other tests' tasks), stopped (SIGSTOP: it takes nothing) while
    the block runs."""
    redis_url = bare_stack.redis_url

    @asynccontextmanager
    async def connection(timeout_s: float) -> AsyncIterator[AbstractConnection]:
        client = connect(redis_url, max_connections=1, blocks_ms=0, timeout_s=timeout_s)
        pid = int((await client.info("server"))["process_id"])
        taken = await client.connection_pool.get_connection()
        os.kill(pid, signal.SIGSTOP)
        try:
            yield taken
        finally:
            os.kill(pid, signal.SIGCONT)
            await client.connection_pool.release(taken)
            await client.aclose()

    return connection


async def _write_large(connection: AbstractConnection) -> None:
    await connection.send_packed_command(connection.pack_command("SET", "w", b"x" * WRITTEN_BYTES))


async def test_a_write_the_os_timed_out_is_a_lost_connection(frozen: Frozen) -> None:
    async with frozen(3) as connection:
        assert connection._writer is not None  # connected: the client's INFO went on it
        sock = connection._writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 200)  # TCP gives up soon
        with pytest.raises(RedisConnectionError):
            await _write_large(connection)
        assert not connection.is_connected


async def test_a_write_past_the_socket_timeout_is_still_a_timeout(frozen: Frozen) -> None:
    """A server that takes nothing for the whole bound is slow (or frozen), not gone."""
    async with frozen(0.2) as connection:
        with pytest.raises(RedisTimeoutError):
            await _write_large(connection)
        assert not connection.is_connected
