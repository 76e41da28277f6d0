"""Sharded pub/sub wakes every waiter (long-poll, submit-and-wait) when a worker ends jobs (one
message per micro-batch, an array of the job views this producer waits for): no polling, and
one connection per Redis node however many requests wait.

Each partition's replies to this producer go to its own channel in the partition's slot
(`Keys.reply`), because the scripts that end jobs SPUBLISH from that slot; the listener
SSUBSCRIBEs on the node that owns each channel. A message can be lost while a node fails over
(pub/sub is not stored), so after any reconnection the listener reads every job it still waits
for and wakes those that ended: a waiter never sits out its timeout for a reply it missed.

Another producer's channel (a job submitted through another replica) is left once idle: instance
ids change with every restart, so a producer that kept them held every channel it ever followed,
each resubscribed on every reconnection."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeGuard, cast

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from producer_api.redis_outage import RedisOutage
from producer_api.task_cancel import cancel_and_wait
from shared.codec import OUTPUTS_TEXT, as_text, loads, spliced_outputs
from shared.job_states import TERMINAL
from shared.job_store import JobRecord, JobStore
from shared.keys import Keys, job_tag
from shared.redis_client import (
    RedisClient,
    is_cluster,
    push_as_received,
    reread_topology,
    subscriber,
)

log = logging.getLogger(__name__)
# A subscription silent this long is sent a PING; silent as long again, its connection is taken
# for dead: a node whose host vanished without closing its sockets (a lost instance, a network
# partition) left `listen()` reading forever while the cluster promoted its replica, and every
# waiter on its partitions sat out its whole wait until the producer restarted.
QUIET_S = 5.0
LIVENESS = "conveyor-reply-listener"
# Another producer's channel that no request followed this long, with no waiter on its partition,
# is unsubscribed (a sweep every quarter of it); a later request follows it again.
IDLE_S = 300.0
Node = tuple[str, int]  # (host, port); one server is the node (None-less key: ("", 0))
ONE_SERVER: Node = ("", 0)


class ReplyListener:
    def __init__(self, client: RedisClient, keys: Keys, producer: str, jobs: JobStore) -> None:
        self.redis = client
        self.keys = keys
        self.producer = producer
        self.jobs = jobs
        # each job's waiters, with when each registered (`_idle`)
        self._waiters: dict[str, dict[asyncio.Future[dict[str, Any]], float]] = defaultdict(dict)
        self._nodes: dict[Node, aioredis.client.PubSub] = {}
        self._channels: dict[str, Node] = {}
        self._made = 0  # subscriptions made so far: see `follow`
        self._made_at: dict[str, int] = {}  # each channel's number among them
        self._used: dict[str, float] = {}  # when each other producer's channel was last followed
        # channels unsubscribed on each node whose confirmation is not read yet: not slot moves
        self._leaving: dict[Node, list[str]] = defaultdict(list)
        self._tasks: dict[Node, asyncio.Task[None]] = {}
        # every listening task still running, those moving off a lost node too (no longer a
        # node's in `_tasks`), for `stop`
        self._running: set[asyncio.Task[None]] = set()
        self._rechecking: asyncio.Task[None] | None = None  # the latest recheck: `_recheck_soon`
        self._lock = asyncio.Lock()

    def channel(self, job_id: str) -> str:
        """Where workers reply to this producer about `job_id` (its partition's channel)."""
        return self.keys.reply(self.producer, job_tag(job_id))

    async def start(self, tags: Iterable[str]) -> None:
        """Subscribe to this producer's channel of every partition tag known now (the model
        repository's), so that the first job of each never races its subscription."""
        await self._subscribe([self.keys.reply(self.producer, tag) for tag in tags])

    async def stop(self) -> None:
        """Every listening task ends, one resubscribing a lost node's channels elsewhere too,
        and every recheck: left running, it retried for good once the producer stopped (a
        cluster gone). Those started while others are stopped (a move's new node, its recheck)
        are stopped too."""
        while self._running:
            await cancel_and_wait(self._running.pop())
        for pubsub in self._nodes.values():
            await pubsub.aclose()

    def made(self) -> int:
        """How many subscriptions were made so far: noted before a read of a job, it tells
        `follow` whether the job's channel was subscribed after that read."""
        return self._made

    async def follow(self, channel: str, since: int) -> bool:
        """Also hear a channel this producer did not subscribe yet (another producer's, for a
        job submitted through another replica; a partition not known at start). True when the
        subscription came after `since` (a `made()`), by this call or another request's: what
        was published on it before went unheard, so a read before then must be done again.
        Another producer's channel is left once idle (`_sweep`): a later call subscribes it
        again, and so answers True."""
        if not channel:
            return False
        if channel not in self._channels:
            await self._subscribe([channel])
        if channel != self.keys.reply(self.producer, _hash_tag(channel)):
            self._used[channel] = asyncio.get_running_loop().time()
        return self._made_at.get(channel, 0) > since

    async def register(self, job_id: str, follow: bool = True) -> asyncio.Future[dict[str, Any]]:
        """A future the job's end resolves; a subscription that fails leaves no waiter. With
        `follow`, the job's channel on this producer is subscribed first (a job about to be
        submitted here); without, the caller follows the channel its job names once it knows
        the job exists (a poll of an unknown id subscribed a channel)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[job_id][future] = future.get_loop().time()
        try:
            if follow:
                await self.follow(self.channel(job_id), self._made)
        except BaseException:
            self.unregister(job_id, future)
            raise
        return future

    def unregister(self, job_id: str, future: asyncio.Future[dict[str, Any]]) -> None:
        waiters = self._waiters.get(job_id)
        if waiters is not None:
            waiters.pop(future, None)
            if not waiters:
                del self._waiters[job_id]

    async def _subscribe(self, channels: list[str]) -> None:
        async with self._lock:
            for channel in channels:
                if channel in self._channels:
                    continue
                node = self._node_of(channel)
                pubsub = self._pubsub(node)
                try:
                    await pubsub.ssubscribe(channel)
                except BaseException:
                    if node not in self._channels.values():
                        await self._drop(node)
                    raise
                self._channels[channel] = node
                self._made += 1
                self._made_at[channel] = self._made

    def _node_of(self, channel: str) -> Node:
        if not is_cluster(self.redis):
            return ONE_SERVER
        node = cast(Any, self.redis).get_node_from_key(channel)
        return str(node.host), int(node.port)

    def _pubsub(self, node: Node) -> aioredis.client.PubSub:
        """The subscription connection to `node`, with its listening task (made on first use)."""
        if node not in self._nodes:
            client = subscriber(self.redis, None if node == ONE_SERVER else node)
            pubsub = client.pubsub(push_handler_func=push_as_received)
            self._nodes[node] = pubsub
            # its own context: made by a request, it took that request's trace for good
            task = asyncio.create_task(
                self._listen(node), name="reply-listener", context=contextvars.Context()
            )
            self._tasks[node] = task
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return self._nodes[node]

    async def _drop(self, node: Node) -> None:
        """Forget `node`'s connection and stop its task: its first SSUBSCRIBE failed (a master
        dead and not yet failed over), and kept, the task woke every 50 ms for good, one more
        for each address a failover moved the channel to. The next subscription there makes
        them anew. Judged by the channels held there, not by redis-py's `subscribed`, which the
        failed channel had set: the task, reading the frozen connection meanwhile, failed too
        and moved off the node on its own, a while after the subscribe had failed."""
        pubsub = self._nodes.pop(node)
        await cancel_and_wait(self._tasks.pop(node, None))
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()

    async def _listen(self, node: Node) -> None:
        outage = RedisOutage("reply listener")
        pubsub = self._nodes[node]
        while True:
            try:
                if outage.failures:
                    self._leaving.pop(node, None)  # their confirmations went with the connection
                    await pubsub.connect()  # reconnects, then resubscribes its channels
                    outage.recovered()
                    self._recheck_soon()
                async for message in _heard(pubsub, lambda: self._sweep(node, pubsub)):
                    if message["type"] == "smessage":
                        self._deliver_all(message["data"])
                    elif message["type"] == "sunsubscribe" and self._held(node, message):
                        # the node gave the channel's slot away (resharding): it says so, and
                        # nothing else, and the connection lives on
                        await self._move_off(node, "a slot moved")
                        return
                await asyncio.sleep(0.05)  # no channel subscribed here (yet)
            except RedisError as exc:
                if is_cluster(self.redis) and node != ONE_SERVER:
                    await self._move_off(node, exc)
                    return
                if outage.failures:
                    # lost, and not made again: Redis is away, and no reply can come (a
                    # connection lost while Redis answers is made again at once, and wakes none)
                    self.wake_all()
                await asyncio.sleep(outage.failed(exc))

    def _held(self, node: Node, message: dict[str, Any]) -> bool:
        """Whether an unsubscription is of a channel this listener holds on `node`, not the
        server's confirmation of one `_sweep` left (taken off its list here): that channel may
        be held again already, followed meanwhile."""
        channel = as_text(message["channel"])
        if channel in self._leaving[node]:
            self._leaving[node].remove(channel)
            return False
        return self._channels.get(channel) == node

    def _idle(self, node: Node) -> list[str]:
        """Other producers' channels on `node` followed last `IDLE_S` ago or more, and not
        since a waiter of their partition registered: a long-poll registers its waiter before
        it follows, so a waiter that registered after a channel's last follow waits on another
        (or follows this one again, subscribing it anew). Any waiter on the partition kept a
        channel: under steady traffic one always waits, and every channel of every peer that
        ever restarted was kept."""
        now = asyncio.get_running_loop().time()
        first: dict[str, float] = {}  # each waited partition's earliest registration
        for job_id, waiters in self._waiters.items():
            tag = job_tag(job_id)
            first[tag] = min([first.get(tag, now), *waiters.values()])
        return [
            channel
            for channel, used in self._used.items()
            if now - used >= IDLE_S
            and self._channels.get(channel) == node
            and used < first.get(_hash_tag(channel), now)
        ]

    async def _sweep(self, node: Node, pubsub: aioredis.client.PubSub) -> None:
        """Unsubscribe `node`'s idle channels. Each leaves `_channels` before its SUNSUBSCRIBE
        (the lock keeps a new subscription behind it), so a request that follows it meanwhile
        subscribes it again, and reads its job again (`follow`); it leaves redis-py's list too,
        or a reconnection before the server's confirmation would subscribe it again."""
        if not self._idle(node):
            return
        encoder = pubsub.encoder
        async with self._lock:
            for channel in self._idle(node):
                del self._channels[channel], self._made_at[channel], self._used[channel]
                pubsub.shard_channels.pop(encoder.decode(encoder.encode(channel)), None)
                self._leaving[node].append(channel)
                await pubsub.sunsubscribe(channel)  # one slot a command, as SSUBSCRIBE

    async def _move_off(self, node: Node, reason: object) -> None:
        """A cluster node failed (or gave up a slot): subscribe its channels again wherever
        their slots live now, once the cluster has a master for them, then recheck waiters."""
        log.warning("reply listener lost %s:%s (%r); resubscribing elsewhere", *node, reason)
        async with self._lock:
            pubsub = self._nodes.pop(node)
            self._tasks.pop(node, None)
            self._leaving.pop(node, None)
            moved = [channel for channel, owner in self._channels.items() if owner == node]
            for channel in moved:
                del self._channels[channel]
        with contextlib.suppress(RedisError, OSError):
            await pubsub.aclose()
        outage = RedisOutage("reply listener")
        while True:
            try:
                await reread_topology(self.redis)
                await self._subscribe(moved)
                break
            except RedisError as error:
                await asyncio.sleep(outage.failed(error))
        self._recheck_soon()

    def _recheck_soon(self) -> None:
        """Recheck the waiters in a task of its own, which replaces one still retrying (a read
        it has in flight may come before this gap). Given up at its first error (LOADING while
        a restarted server reads its data back), the waiters whose jobs ended in the gap sat
        out their whole wait; retried inline, a read that kept failing stopped the listening."""
        if self._rechecking is not None:
            self._rechecking.cancel()
        task = asyncio.create_task(
            self._recheck(), name="reply-recheck", context=contextvars.Context()
        )
        self._rechecking = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _recheck(self) -> None:
        """Wake waiters whose jobs ended while a reply could have been lost (one round trip,
        retried with backoff until Redis answers: the waiters read anew each time)."""
        outage = RedisOutage("reply listener recheck")
        while True:
            try:
                records = await self.jobs.get_many(list(self._waiters))
                break
            except RedisError as exc:
                await asyncio.sleep(outage.failed(exc))
        outage.recovered()
        for record in records:
            if record is not None and (view := _ended_view(record)) is not None:
                self._deliver(view)

    def wake_all(self) -> None:
        """Answer every waiter with an empty view, "no end heard" (the producer is stopping:
        producer_api/draining.py; Redis is away); each then reads its job as it stands, which
        fails at once (the house 503) while Redis is away: left waiting, a long-poll sat out
        its whole wait before it said so."""
        for future in (f for waiters in self._waiters.values() for f in waiters):
            if not future.done():
                future.set_result({})

    def _deliver_all(self, data: bytes) -> None:
        """A worker publishes an array per micro-batch (every job of it this producer waits
        for; several of ~1 MiB at most when it publishes after a replica WAIT); a cancel or a
        dead letter publishes one view alone. What is no ended job's view (not JSON, no text
        `id`, no terminal `status`) is logged and dropped alone: raised, it ended the listening
        task, and every waiter of this producer sat out its whole wait from then on; delivered,
        it woke its job's waiters before the job had ended."""
        try:
            message = loads(data)
        except orjson.JSONDecodeError:
            message = None
        for view in message if isinstance(message, list) else [message]:
            if _is_view(view):
                self._deliver(spliced_outputs(view))
            else:
                log.warning("reply listener dropped a message that ends no job: %.200r", data)

    def _deliver(self, view: dict[str, Any]) -> None:
        for future in self._waiters.pop(as_text(view.get("id", "")), ()):
            if not future.done():
                future.set_result(view)


def _ended_view(record: JobRecord) -> dict[str, Any] | None:
    """The job's view if it ended, else None. A hash that makes no view (no status, or one that
    is no state; a field's JSON corrupt) is logged and skipped: raised, it ended the listening
    task, and every waiter of this producer sat out its whole wait from then on. Its own
    waiters sit out theirs, then read the job as it stands."""
    try:
        return record.view(spliced=True) if record.status.terminal else None
    except (KeyError, ValueError) as exc:  # JSONDecodeError is a ValueError
        log.warning("reply listener skipped job %s, its hash unreadable (%r)", record.job_id, exc)
        return None


def _is_view(view: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a reply's item is the view of a job that ended: an object with a text `id` and
    a terminal `status` (and its outputs, if written as text, as text)."""
    return (
        isinstance(view, dict)
        and isinstance(view.get("id"), str)
        and isinstance(status := view.get("status"), str)
        and status in TERMINAL
        and isinstance(view.get(OUTPUTS_TEXT, ""), str)
    )


def _hash_tag(channel: str) -> str:
    """The partition tag a reply channel is braced by (`Keys.reply`; a key prefix has none)."""
    return channel.partition("{")[2].partition("}")[0]


async def _heard(
    pubsub: aioredis.client.PubSub, sweep: Callable[[], Awaitable[None]]
) -> AsyncIterator[dict[str, Any]]:
    """The subscription's messages, while it has channels, with a `sweep` every quarter of
    `IDLE_S`; a connection that stays silent through a PING is dropped (RedisConnectionError),
    so the listener reconnects or moves off the node."""
    clock = asyncio.get_running_loop().time
    heard, pinged, swept = clock(), False, clock()
    while pubsub.subscribed:
        # a sweep is looked for at each return: often enough for a short `IDLE_S` too
        message = await pubsub.get_message(timeout=min(QUIET_S, IDLE_S) / 5)
        if clock() - swept >= IDLE_S / 4:
            await sweep()
            swept = clock()
        if message is not None:
            heard, pinged = clock(), False
            if message["type"] != "pong":
                yield message
        elif clock() - heard >= QUIET_S:
            if pinged:
                await cast(Any, pubsub.connection).disconnect()
                raise RedisConnectionError(f"no answer to a PING in {QUIET_S:g}s")
            await pubsub.ping(LIVENESS)
            heard, pinged = clock(), True
