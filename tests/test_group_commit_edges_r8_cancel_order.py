"""A caller cancelled while its command waits in a flush (a submit cut short by a shutdown)
goes on to issue its next command at once: a submit's look for the job it may have enqueued,
before it gives its idempotency key back. Sent in a later flush on another connection, that
command could run first (the earlier flush still connecting), find no job, and give the key
back to a job then enqueued: the client's retry enqueued it twice. A cancelled caller now
returns once its command was answered."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from producer_api.jobs.group_commit import group_committing


async def _stale_on_top(pool: aioredis.ConnectionPool, aredis: aioredis.Redis) -> None:
    """Two idle connections in `pool`, the one taken next closed by the server: the next
    flush connects again, the one after it sends at once."""
    fresh, stale = await pool.get_connection(), await pool.get_connection()
    await stale.send_command("CLIENT", "ID")
    stale_id = await stale.read_response()
    await pool.release(fresh)
    await pool.release(stale)
    await aredis.client_kill_filter(_id=stale_id)


async def test_a_cancelled_callers_next_command_runs_after_it(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    pool = aioredis.ConnectionPool.from_url(redis_url)
    hot = group_committing(aioredis.Redis(connection_pool=pool), "", "hot")
    try:
        await _stale_on_top(pool, aredis)
        first = asyncio.ensure_future(hot.rpush("order", "first"))
        while not pool._in_use_connections:  # its flush took the stale connection
            await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await hot.rpush("order", "next")
        for task in list(hot._sending):  # type: ignore[attr-defined]
            await task
        assert await aredis.lrange("order", 0, -1) == [b"first", b"next"]
    finally:
        await pool.aclose()


async def _flushing(aredis: aioredis.Redis) -> tuple[asyncio.Future[int], asyncio.Task[None]]:
    """A caller's INCR, and the flush task made for it, cancelled before its first step."""
    hot = group_committing(aredis, "", "hot")
    caller = asyncio.ensure_future(hot.incr("counter"))
    while not hot._sending:  # type: ignore[attr-defined]
        await asyncio.sleep(0)
    return caller, next(iter(hot._sending))  # type: ignore[attr-defined]


async def test_a_flush_cancelled_before_it_began_answers_its_callers(
    aredis: aioredis.Redis,
) -> None:
    """Its callers waited for good: only a flush that began reached its own handler."""
    caller, flush = await _flushing(aredis)
    flush.cancel()
    await asyncio.wait({caller}, timeout=1)
    assert caller.cancelled()


async def test_a_shutdown_cancelling_callers_and_flush_ends_them(aredis: aioredis.Redis) -> None:
    """asyncio.run cancels every task as it ends: a cancelled caller waiting for its reply
    must not wait for a flush that never runs."""
    caller, flush = await _flushing(aredis)
    caller.cancel()
    flush.cancel()
    await asyncio.wait({caller}, timeout=1)
    assert caller.cancelled()
