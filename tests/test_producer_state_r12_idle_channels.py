"""Another producer's reply channel is left once idle, on a real Valkey. It was kept for as long
as anything at all waited on its partition: under steady traffic some long-poll always does, so
a producer held every channel of every peer that ever restarted (instance ids change with each
rollout), each resubscribed on every reconnection. Only a waiter that registered before the
channel was last followed can be waiting on it; later ones no longer keep it."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from producer_api import reply_listener
from producer_api.reply_listener import ReplyListener
from shared.codec import OUTPUTS_TEXT, dumps
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect
from tests.conftest import until_async

KEYS = Keys()
TAG = "abcd"


async def _left(aredis: aioredis.Redis, channel: str) -> bool:
    """Whether the server holds no subscriber of `channel` (the listener left it)."""
    _, count = await aredis.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(count) == 0


async def test_a_peer_channel_idle_under_steady_waits_is_left(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reply_listener, "IDLE_S", 0.2)
    client = connect(redis_url)
    listener = ReplyListener(client, KEYS, "p1", JobStore(client, KEYS, 60))
    try:
        await listener.start([TAG])
        gone_peer = KEYS.reply("p0", TAG)  # a replica since restarted under a new id
        await listener.follow(gone_peer, listener.made())
        job_id = TAG + "5" * 28
        # steady traffic: a long-poll of this partition waits, registered after that follow
        waiting = await listener.register(job_id)
        await until_async(lambda: _left(aredis, gone_peer), timeout=30, every=0.05)

        reply = [{"id": job_id, "status": "succeeded", OUTPUTS_TEXT: "{}"}]
        await aredis.execute_command("SPUBLISH", listener.channel(job_id), dumps(reply))
        # a bound, not a timing: a loaded machine can stall the listener a few seconds
        assert (await asyncio.wait_for(waiting, timeout=10))["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()
