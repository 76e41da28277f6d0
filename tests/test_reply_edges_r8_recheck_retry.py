"""After a reconnection the reply listener reads every job it waits for. A read refused then
(LOADING while a restarted server reads its data back; here a permission the listener's user
lacks for a moment) was given up until the next reconnection: a waiter whose job ended in the
gap sat out its whole wait. The read is retried until it succeeds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis

from producer_api.redis_outage import MAX_RETRY_S
from producer_api.reply_listener import ReplyListener
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect
from tests.conftest import until_async

USER = "reply-recheck-r8"
ENDED: dict[Any, Any] = {"status": "succeeded", "model": "m", "variant": "default", "outputs": "{}"}
# Bounds, not timings: the refused read is retried with a backoff that doubles up to
# MAX_RETRY_S, so a test stalled a second or two on a loaded machine (more refusals before it
# grants the read again) waits that much longer for the retry that gets through.
RETRIED_WITHIN_S = 2 * MAX_RETRY_S
REFUSED_WITHIN_S = 30


@pytest.fixture
async def user_url(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[str]:
    """The server's URL as a user of its own, whose rights the test changes (and that leaves
    with its connections)."""
    await aredis.execute_command("ACL", "SETUSER", USER, "on", ">pw", "~*", "&*", "+@all")
    await aredis.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(redis_url)
    yield urlunsplit(parts._replace(netloc=f"{USER}:pw@{parts.hostname}:{parts.port}"))
    await aredis.execute_command("ACL", "DELUSER", USER)


async def _kill_subscriptions(aredis: aioredis.Redis) -> None:
    """Close the listener's subscription: it reconnects, then rechecks its waiters."""
    for peer in await aredis.client_list():
        if peer.get("ssub") == "1":
            await aredis.client_kill_filter(_id=peer["id"])


async def _refused_hgetall(aredis: aioredis.Redis) -> bool:
    """Whether the listener's read of its waiters was refused (the server logs each refusal)."""
    return any(entry.get("object") == "hgetall" for entry in await aredis.acl_log())


async def test_a_recheck_refused_once_is_retried(user_url: str, aredis: aioredis.Redis) -> None:
    client = connect(user_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "recheck-r8", JobStore(client, keys, 60))
    job_id = "abcd" + "7" * 28
    try:
        waiting = await listener.register(job_id)
        await aredis.hset(keys.job(job_id), mapping=ENDED)  # its reply never sent
        await aredis.execute_command("ACL", "SETUSER", USER, "-hgetall")
        await _kill_subscriptions(aredis)
        await until_async(lambda: _refused_hgetall(aredis), timeout=REFUSED_WITHIN_S, every=0.02)
        await aredis.execute_command("ACL", "SETUSER", USER, "+hgetall")
        assert (await asyncio.wait_for(waiting, timeout=RETRIED_WITHIN_S))["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()


async def test_stop_ends_a_recheck_still_retrying(user_url: str, aredis: aioredis.Redis) -> None:
    """A recheck retried for good would outlive its producer (the server refusing it still)."""
    client = connect(user_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "recheck-r8", JobStore(client, keys, 60))
    try:
        await listener.register("abcd" + "8" * 28)
        await aredis.execute_command("ACL", "SETUSER", USER, "-hgetall")
        await _kill_subscriptions(aredis)
        await until_async(lambda: _refused_hgetall(aredis), timeout=REFUSED_WITHIN_S, every=0.02)
    finally:
        await listener.stop()
        await client.aclose()
    assert not [task for task in asyncio.all_tasks() if task.get_name() == "reply-recheck"]
