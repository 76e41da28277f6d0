"""A worker's reply to the waiting producer carries a job's outputs as the JSON text the worker
wrote them in: neither the producer nor anyone before it parses or formats the numbers, and the
producer's answer holds that text as it was, the same job view a parsed reply would give."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api import reply_listener
from producer_api.reply_listener import QUIET_S, ReplyListener
from shared.codec import OUTPUTS_TEXT, dumps, loads, spliced_outputs
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect
from workers.partition.finish import Finish


def _finish(outputs: str) -> Finish:
    fields = {"outputs": outputs, "finished": "1700000000250", "queue_wait_ms": "0.412"}
    context = {"model": "minilm", "variant": "default", "created": "1700000000000"}
    return Finish(b"1-0", "job-1", "t:reply:p1", "succeeded", fields, context)


def test_outputs_travel_as_text_and_are_answered_as_written() -> None:
    outputs = dumps({"embeddings": np.float32([[0.1, -2.5e-8, 1.0]])}).decode()
    finish = _finish(outputs)
    sent = loads(dumps([loads(finish.message())]))  # as FINISH joins a micro-batch's views
    [view] = sent
    assert view[OUTPUTS_TEXT] == outputs and "outputs" not in view
    answered = dumps(spliced_outputs(view))
    assert outputs.encode() in answered
    assert loads(answered) == loads(dumps(finish.view()))


def test_a_view_without_outputs_is_left_as_it_is() -> None:
    cancelled = {"id": "job-2", "status": "cancelled", "model": "m", "variant": "v"}
    assert spliced_outputs(dict(cancelled)) == cancelled


async def test_the_listener_takes_a_large_reply_without_formatting_it(
    redis_url: str, aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py's own pub/sub push handler writes every message into a debug line, formatted
    whether or not it is logged (hundreds of µs for a reply of 32 embeddings): the listener's
    replies go around it, and still arrive whole."""
    client = connect(redis_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        outputs = dumps({"embeddings": np.random.rand(32, 384).astype(np.float32)}).decode()
        waiting = await listener.register("job-1")
        caplog.set_level(logging.DEBUG, logger="push_response")
        reply = [{"id": "job-1", "status": "succeeded", OUTPUTS_TEXT: outputs}]
        await aredis.execute_command("SPUBLISH", listener.channel("job-1"), dumps(reply))
        view = await asyncio.wait_for(waiting, timeout=10)
        assert dumps(view["outputs"]) == outputs.encode()
        assert [r for r in caplog.records if r.name == "push_response"] == []
    finally:
        await listener.stop()
        await client.aclose()


async def test_following_says_whether_the_subscription_came_after_a_read(
    redis_url: str,
) -> None:
    """A long-poll reads the job again when its channel was subscribed after its first read: a
    reply published in between went unheard, and the poll sat out its wait. That holds when
    another request made the subscription meanwhile (it was told, the first poll was not)."""
    client = connect(redis_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        other = keys.reply("p2", "abcd")
        read_before = listener.made()  # request A reads its job, then B subscribes the channel
        assert await listener.follow(other, listener.made()) is True  # B's own subscription
        assert await listener.follow(other, read_before) is True  # A reads again
        assert await listener.follow(other, listener.made()) is False  # a read after it
        assert await listener.follow("", read_before) is False  # a job that replies to nobody
    finally:
        await listener.stop()
        await client.aclose()


async def test_a_registration_whose_subscription_fails_leaves_no_waiter() -> None:
    """The waiter stayed behind for good, read again by every recheck after a reconnection."""
    client = connect("redis://127.0.0.1:9", timeout_s=1)  # nothing listens there
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        with pytest.raises(RedisConnectionError):
            await listener.register("abcd" + "0" * 28)
        assert listener._waiters == {}  # nothing public tells
    finally:
        await listener.stop()
        await client.aclose()


async def test_a_reply_lost_while_the_listener_reconnected_is_found_by_a_recheck(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A pub/sub connection that retried reconnected and subscribed again unseen: a reply
    published in the gap was lost, and its waiter sat out its whole wait. Now the listener sees
    each break and reads what it waits for after it."""
    client = connect(redis_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        job_id = "abcd" + "1" * 28
        waiting = await listener.register(job_id)
        fields = {"status": "succeeded", "model": "m", "variant": "default", "outputs": "{}"}
        await aredis.hset(keys.job(job_id), mapping=fields)  # ended; its reply never sent
        for peer in await aredis.client_list():
            if peer.get("ssub") == "1":
                await aredis.client_kill_filter(_id=peer["id"])
        view = await asyncio.wait_for(waiting, timeout=10)
        assert view["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()


async def _shard_subscribers(aredis: aioredis.Redis, channel: str) -> int:
    _, count = await aredis.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(count)


async def _until_left(listener: ReplyListener, aredis: aioredis.Redis, channel: str) -> None:
    """Wait for a sweep of the listener (each second or so here) to have left `channel`."""
    for _ in range(300):
        held = channel in listener._channels  # nothing public tells
        if not held and await _shard_subscribers(aredis, channel) == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{channel} is still subscribed")


async def test_another_producers_channel_left_idle_is_unsubscribed_and_heard_again(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll of a job submitted through another replica subscribed that replica's channel
    for good: instance ids change with every restart, so across rollouts a producer held every
    channel it ever followed, and resubscribed each on every reconnection. Now one idle past
    `IDLE_S` with no waiter on its partition is left (this producer's own never are), and one
    followed again is heard again, the read before it done again."""
    # the liveness PING keeps its default quiet period: at 1 s, a pong late on a loaded
    # machine dropped the connection, and the replies published in the gap went unheard
    monkeypatch.setattr(reply_listener, "IDLE_S", 0.2)
    client = connect(redis_url)
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        await listener.start(["abcd"])
        awaited_job, job_id = "ef01" + "4" * 28, "abcd" + "3" * 28
        own, idle = listener.channel(job_id), keys.reply("p2", "abcd")
        awaited = keys.reply("p2", "ef01")  # another producer's too, but a waiter's
        held = await listener.register(awaited_job, follow=False)
        for channel in (idle, awaited):
            await listener.follow(channel, listener.made())
        await _until_left(listener, aredis, idle)
        for kept in (own, awaited):
            assert kept in listener._channels and await _shard_subscribers(aredis, kept) == 1

        read_before = listener.made()
        waiting = await listener.register(job_id, follow=False)
        assert await listener.follow(idle, read_before) is True  # the read must be done again
        for channel, job in ((idle, job_id), (awaited, awaited_job)):
            reply = [{"id": job, "status": "succeeded", OUTPUTS_TEXT: "{}"}]
            await aredis.execute_command("SPUBLISH", channel, dumps(reply))
        for future in (waiting, held):
            assert (await asyncio.wait_for(future, timeout=10))["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()


class _SilentProxy:
    """TCP to Valkey; `silence()` drops everything on the connections open now, both ways,
    without closing them (a host gone without a FIN or RST); later connections pass."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.era = 0
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._pass, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    def silence(self) -> None:
        self.era += 1

    async def _pass(self, client: asyncio.StreamReader, back: asyncio.StreamWriter) -> None:
        upstream, forth = await asyncio.open_connection(*self.target)
        era = self.era
        await asyncio.gather(self._copy(client, forth, era), self._copy(upstream, back, era))

    async def _copy(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, era: int
    ) -> None:
        while data := await source.read(65536):
            if self.era == era:
                sink.write(data)
                await sink.drain()


async def test_a_silent_subscription_is_noticed_and_what_it_missed_found(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose host vanished without closing its sockets left the listener reading its
    connection forever: replies published elsewhere (a promoted replica) went unheard and every
    waiter sat out its whole wait. Now silence through a PING drops the connection: the
    listener reconnects and reads what it waits for."""
    # a quiet period of 1 s, not 5 (it is sat out twice: before the PING and after it); the
    # wait below stays bounded by the default's
    monkeypatch.setattr(reply_listener, "QUIET_S", 1.0)
    proxy = _SilentProxy(redis_url)
    server = await proxy.start()
    client = connect(f"redis://127.0.0.1:{proxy.port}/0", timeout_s=1)
    keys = Keys()
    listener = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    try:
        job_id = "abcd" + "2" * 28
        waiting = await listener.register(job_id)
        proxy.silence()
        fields = {"status": "succeeded", "model": "m", "variant": "default", "outputs": "{}"}
        await aredis.hset(keys.job(job_id), mapping=fields)  # its reply lost with the node
        view = await asyncio.wait_for(waiting, timeout=4 * QUIET_S)
        assert view["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()
        server.close()
