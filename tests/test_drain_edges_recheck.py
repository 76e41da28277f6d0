"""After a reconnection the reply listener reads every job it waits for: a hash it cannot make
a view of (a status that is no state, a field's JSON corrupt) once raised there and ended the
listening task, and every waiter of the producer sat out its whole wait from then on."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from producer_api.reply_listener import ReplyListener
from shared.codec import dumps
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect

ENDED = {"status": "succeeded", "model": "m", "variant": "default", "outputs": "{}"}


async def _kill_subscriptions(aredis: aioredis.Redis) -> None:
    for peer in await aredis.client_list():
        if peer.get("ssub") == "1":
            await aredis.client_kill_filter(_id=peer["id"])


async def test_a_recheck_skips_a_job_it_cannot_read_and_wakes_the_rest(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    client = connect(redis_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "drain-edges", JobStore(client, keys, 60))
    unknown, statusless, corrupt, ended, later = ("abcd" + digit * 28 for digit in "56789")
    try:
        await aredis.hset(keys.job(unknown), mapping={**ENDED, "status": "misplaced"})
        await aredis.hset(keys.job(statusless), mapping={"model": "m"})
        await aredis.hset(keys.job(corrupt), mapping={**ENDED, "error": "{not json"})
        # registered first, the unreadable jobs are read before the one that ended
        for job_id in (unknown, statusless, corrupt):
            await listener.register(job_id)
        waiting = await listener.register(ended)
        await aredis.hset(keys.job(ended), mapping=ENDED)  # its reply never sent
        await _kill_subscriptions(aredis)
        assert (await asyncio.wait_for(waiting, timeout=5))["status"] == "succeeded"
        # and the listener still hears replies
        heard = await listener.register(later)
        reply = [{**ENDED, "id": later, "outputs": {}}]
        await aredis.execute_command("SPUBLISH", listener.channel(later), dumps(reply))
        assert (await asyncio.wait_for(heard, timeout=5))["id"] == later
    finally:
        await listener.stop()
        await client.aclose()
