"""Group commit for the producer's hot path: every command issued in one event-loop turn (the
rate-limit bucket, the in-flight admission, idempotency claims, the ENQUEUE script of every
submit that arrived together) goes to Redis as one non-transactional pipeline, so under load a
producer makes one round trip per tick instead of one per command per request.

`GroupCommitRedis` is a redis-py client whose `execute_command` queues instead of sending; the
stores built on it (JobStore, limiters, idempotency keys) need no change, and each caller still
gets its own reply or its own exception (a refused or failing command fails alone)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import Counter

FLUSHES = Counter("conveyor_group_commit_flushes", "Pipelines sent by group commit (round trips)")
COMMANDS = Counter("conveyor_group_commit_commands", "Redis commands sent by group commit")

# Commands that wait on the server (or own their connection) are never held up with others.
_DIRECT = frozenset({"BLPOP", "BRPOP", "BLMOVE", "BZPOPMIN", "BZPOPMAX", "WAIT", "XREAD"})
_DIRECT |= {"XREADGROUP", "SUBSCRIBE", "PSUBSCRIBE", "MONITOR"}

_Pending = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]


class GroupCommitRedis(aioredis.Redis):
    """A client sharing another client's pool whose commands are group-committed: the first
    command of a turn schedules a flush with `loop.call_soon`; the flush sends every command
    queued by then in one pipeline and resolves each caller's future with its own result.
    Order is kept: commands of one turn run in the order they were issued, and a caller's next
    command (issued after it awaited the previous one) lands in a later flush."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        super().__init__(connection_pool=pool)
        self._pending: list[_Pending] = []
        self._sending: set[asyncio.Task[None]] = set()  # held, so no flush is collected mid-way

    @classmethod
    def sharing(cls, client: aioredis.Redis) -> GroupCommitRedis:
        """A group-committing client over `client`'s connection pool (closed with it)."""
        return cls(client.connection_pool)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in _DIRECT:
            return await super().execute_command(*args, **options)
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
        pipe = self.pipeline(transaction=False)
        for args, options, _ in batch:
            pipe.pipeline_execute_command(*args, **options)
        try:
            replies = await pipe.execute(raise_on_error=False)
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
