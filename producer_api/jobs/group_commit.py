"""Group commit for the producer's hot path: every command issued in one event-loop turn (the
rate-limit bucket, the in-flight admission, idempotency claims, the ENQUEUE script of every
submit that arrived together) goes to Redis as one non-transactional pipeline, so under load a
producer makes one round trip per tick instead of one per command per request.

`GroupCommit` makes a redis-py client whose `execute_command` queues instead of sending; the
stores built on it (JobStore, limiters, idempotency keys) need no change, and each caller still
gets its own reply or its own exception (a refused or failing command fails alone).

With `CONVEYOR_REPLICA_ACKS`, each pipeline that writes ends with WAIT on every node it wrote to,
and no caller hears back before the replicas confirmed the batch: a 202 is never given for a job a
failover could lose. A cluster client (`GroupCommitCluster`) batches the same way; redis-py
splits its pipeline per node, still one round trip in parallel."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.cluster import READ_COMMANDS

from shared.redis_client import (
    HiredisCluster,
    RedisClient,
    check_replica_acks,
    connect,
    executed,
    is_cluster,
    queue_replica_wait,
)

FLUSHES = Counter("conveyor_group_commit_flushes", "Pipelines sent by group commit (round trips)")
COMMANDS = Counter("conveyor_group_commit_commands", "Redis commands sent by group commit")

# Commands that wait on the server (or own their connection) are never held up with others.
_DIRECT = frozenset({"BLPOP", "BRPOP", "BLMOVE", "BZPOPMIN", "BZPOPMAX", "WAIT", "XREAD"})
_DIRECT |= {"XREADGROUP", "SUBSCRIBE", "PSUBSCRIBE", "MONITOR", "SCRIPT LOAD"}

# Commands that change nothing: a flush of only these waits for no replica. redis-py's list of
# read-only commands (what it may send to a replica) lacks the few below.
_READS = READ_COMMANDS | {"PING", "XINFO STREAM", "XINFO GROUPS", "XINFO CONSUMERS"}

_Pending = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]


def _written_key(args: tuple[Any, ...]) -> str | None:
    """The key a command writes (a script's first key; one node owns all of a command's keys),
    or None for a read."""
    name = str(args[0]).upper()
    if name in _READS:
        return None
    if name in ("EVALSHA", "EVAL") and int(args[2]) > 0:
        return str(args[3])
    return str(args[1]) if len(args) > 1 else ""


def group_committing(client: RedisClient, url: str, name: str) -> RedisClient:
    """A group-committing client beside `client`: over its pool (one server), or a cluster
    client of its own on `url`, named `name`."""
    if not is_cluster(client):
        return GroupCommitRedis(client.connection_pool)
    return connect(url, name=name, blocks_ms=0, cluster_class=GroupCommitCluster)


class GroupCommit:
    """The first command of a turn schedules a flush with `loop.call_soon`; the flush sends
    every command queued by then in one pipeline and resolves each caller's future with its
    own result. Order is kept: commands of one turn run in the order they were issued, and a
    caller's next command (issued after it awaited the previous one) lands in a later flush.
    Mixed into a redis-py client class, before it."""

    _pending: list[_Pending]
    _sending: set[asyncio.Task[None]]  # held, so no flush is collected mid-way

    def _start_batching(self) -> None:
        self._pending = []
        self._sending = set()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in _DIRECT:
            return await super().execute_command(*args, **options)  # type: ignore[misc]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((args, options, future))
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        """One pipeline for the whole batch; a reply that is an error fails its caller only,
        a connection that fails after retries fails every caller of the batch."""
        FLUSHES.inc()
        COMMANDS.inc(len(batch))
        # lazy: only read when replica acks are on
        written = (key for args, _, _ in batch if (key := _written_key(args)) is not None)
        try:
            pipe: Any = self.pipeline(transaction=False)  # type: ignore[attr-defined]
            for args, options, _ in batch:
                pipe.execute_command(*args, **options)
            waits = await queue_replica_wait(cast(RedisClient, self), pipe, written)
            replies = await executed(pipe, raise_on_error=False)
            if waits:
                check_replica_acks(replies[-waits:])
                replies = replies[:-waits]
        except BaseException as exc:  # the callers see the error; a cancel ends them too
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)


class GroupCommitRedis(GroupCommit, aioredis.Redis):  # type: ignore[misc]
    """Group commit over one server's pool, shared with the client it was made from (closed
    with it)."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        super().__init__(connection_pool=pool)
        self._start_batching()


class GroupCommitCluster(GroupCommit, HiredisCluster):  # type: ignore[misc]
    """Group commit over a cluster: a cluster client of its own (a cluster client's node pools
    cannot be shared), made by `connect` like every other."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self._start_batching()
