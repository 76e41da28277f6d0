"""Group commit for the producer's hot path: every command issued in one event-loop turn (the
rate-limit bucket, the in-flight admission, idempotency claims, the ENQUEUE script of every
submit that arrived together) goes to Redis as one non-transactional pipeline (a turn of one
command, as that command), so under load a producer makes one round trip per tick instead of one
per command per request.

`GroupCommit` makes a redis-py client whose `execute_command` queues instead of sending; the
stores built on it (JobStore, limiters, idempotency keys) need no change, and each caller still
gets its own reply or its own exception (a refused or failing command fails alone). Calls of a
script given a merge are sent as fewer calls: the producer's ENQUEUE calls of one lane in a flush
become one (shared/job_store.merged_enqueues).

With `CONVEYOR_REPLICA_ACKS`, each pipeline that writes ends with WAIT on every node it wrote to,
and no caller of a write hears back before the replicas confirmed it: a 202 is never given for a
job a failover could lose. A WAIT that falls short fails the writes to its node only: reads, the
scripts that need no ack (`_UNACKED`) and other nodes' writes keep their replies, so a shard
without its replicas refuses the submits to its partitions, not every request. A cluster client
(`GroupCommitCluster`) batches the same way; redis-py splits its pipeline per node, still one
round trip in parallel."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.commands import READ_COMMANDS
from redis.exceptions import NoScriptError, TryAgainError

from shared.job_scripts import POSITION
from shared.rate_limit import IN_FLIGHT, RELEASE, TOKEN_BUCKET
from shared.redis_client import (
    REDIRECTS,
    RETRIES,
    HiredisCluster,
    MergedCall,
    RedisClient,
    ResendsSafely,
    ScriptCall,
    connect,
    executed,
    is_cluster,
    preload,
    queue_replica_waits,
    replica_shortfall,
)
from shared.settings import get_settings

FLUSHES = Counter("conveyor_group_commit_flushes", "Pipelines sent by group commit (round trips)")
COMMANDS = Counter("conveyor_group_commit_commands", "Redis commands sent by group commit")

# Commands that wait on the server (or own their connection) are never held up with others.
_DIRECT = frozenset({"BLPOP", "BRPOP", "BLMOVE", "BZPOPMIN", "BZPOPMAX", "WAIT", "XREAD"})
_DIRECT |= {"XREADGROUP", "SUBSCRIBE", "PSUBSCRIBE", "MONITOR", "SCRIPT LOAD"}

# Commands that change nothing: a flush of only these waits for no replica. redis-py's list of
# read-only commands (what it may send to a replica) lacks the few below.
_READS = READ_COMMANDS | {"PING", "XINFO STREAM", "XINFO GROUPS", "XINFO CONSUMERS"}


def _sha(script: str) -> str:
    """The SHA an EVALSHA names `script` by."""
    return hashlib.sha1(script.encode()).hexdigest()


# Scripts that wait for no replica: what a failover loses of them costs no client anything, and
# a WAIT would fail every caller while their key's shard lacks replicas. The rate limiter's
# token bucket, taken by every authenticated request: a bucket lost refills early, a few
# requests over the rate. The in-flight admission and removals, only a limit: a slot lost lets
# the key hold one job more until one ends (whose removal of the missing slot is a no-op), a
# removal lost keeps a slot until the prune at the cap. POSITION, read only. An idempotency
# claim waits: lost while its job survives, the retry enqueues it again.
_UNACKED = frozenset(map(_sha, (TOKEN_BUCKET, IN_FLIGHT, RELEASE, POSITION)))

_Pending = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]
# How one flush's calls of a script become fewer calls (shared/job_store.merged_enqueues).
Merge = Callable[[list[ScriptCall]], list[MergedCall]]
# A command sent, and the (index in the flush, reply items) of each caller its reply is for.
_Send = tuple[tuple[Any, ...], dict[str, Any], list[tuple[int, int]]]
WHOLE = -1  # a caller's share that is the whole reply (a command sent as it was issued)


def _script_call(args: tuple[Any, ...]) -> ScriptCall:
    """An EVALSHA's keys and arguments."""
    count = int(args[2])
    return list(args[3 : 3 + count]), list(args[3 + count :])


async def _answered(future: asyncio.Future[Any], turn: asyncio.Future[None]) -> Any:
    """The command's reply. A caller cancelled meanwhile (a submit cut short by a shutdown)
    returns, cancelled, only once its flush (`turn`) has answered: it went on at once to its
    next command, which a later flush on another connection could run first (the earlier one
    still connecting): a submit's look for the job it may have enqueued found none, and gave
    back the idempotency key of a job then enqueued. Cancels repeated meanwhile (anyio repeats
    one at every await) wait too; the flush's sockets time out, so the wait is bounded. The
    reply is awaited as it is (a shield cost each command a loop turn more)."""
    try:
        return await future
    except asyncio.CancelledError:
        while not turn.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({turn})
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: the caller gave up on it
        raise


def _cancel_unanswered(
    batch: list[_Pending], turn: asyncio.Future[None], _flush: asyncio.Task[None]
) -> None:
    """End the flush's turn however it ended, and cancel the callers it did not answer:
    cancelled before its first step (the loop shutting down), it never reached its own
    handler, and they waited for good."""
    for *_, future in batch:
        future.cancel()
    if not turn.done():
        turn.set_result(None)


def _shares(parts: list[tuple[int, int]], reply: Any) -> list[tuple[int, Any]]:
    """Each caller's share of a reply: all of it (a command sent as issued), its items of a
    merged call's list, or the error the call got."""
    if isinstance(reply, Exception) or parts[0][1] == WHOLE:
        return [(index, reply) for index, _ in parts]
    shares, start = [], 0
    for index, items in parts:
        shares.append((index, reply[start : start + items]))
        start += items
    return shares


def _merged_script(args: tuple[Any, ...], merges: Mapping[str, Any]) -> bool:
    """Whether the command calls a script whose calls are merged."""
    return args[0] == "EVALSHA" and args[1] in merges


def _written_key(args: tuple[Any, ...]) -> str | None:
    """The key a command writes (a script's first key; one node owns all of a command's keys),
    or None for a read or a script that waits for no replica (`_UNACKED`)."""
    name = str(args[0]).upper()
    if name in _READS or (name == "EVALSHA" and args[1] in _UNACKED):
        return None
    if name in ("EVALSHA", "EVAL") and int(args[2]) > 0:
        return str(args[3])
    return str(args[1]) if len(args) > 1 else ""


def _acked(written: list[str | None], nodes: Mapping[str, str], replies: list[Any]) -> list[Any]:
    """The replies of the commands that `written` names the key of (None: no WAIT for it),
    `replies` ending with the WAITs': each write's (an error reply aside) its node's
    ReplicaAckTimeout where the WAIT fell short. `nodes`: the node of each key written, in the
    order of the WAITs."""
    waited = zip(dict.fromkeys(nodes.values()), replies[len(written) :], strict=True)
    shortfalls = {node: replica_shortfall(ack) for node, ack in waited}
    return [
        reply if key is None or isinstance(reply, Exception) else shortfalls[nodes[key]] or reply
        for key, reply in zip(written, replies[: len(written)], strict=True)
    ]


def _moving(redirect: Exception) -> TryAgainError:
    """A command whose slot kept moving: an outage to its caller (503, back off)."""
    return TryAgainError(f"slot still moving after {RETRIES} redirects: {redirect}")


def group_committing(
    client: RedisClient, url: str, name: str, merges: Mapping[str, Merge] | None = None
) -> RedisClient:
    """A group-committing client beside `client`: over its pool (one server), or a cluster
    client of its own on `url`, named `name`. `merges`: for a script (its text), how the calls
    of it that one flush holds are sent as fewer calls."""
    if not is_cluster(client):
        committing: RedisClient = GroupCommitRedis(client.connection_pool)
    else:
        committing = connect(url, name=name, blocks_ms=0, cluster_class=GroupCommitCluster)
    for script, merge in (merges or {}).items():
        cast(GroupCommit, committing).merge(script, merge)
    return committing


class GroupCommit:
    """The first command of a turn schedules a flush with `loop.call_soon`; the flush sends
    every command queued by then in one pipeline and resolves each caller's future with its
    own result. Order is kept: commands of one turn run in the order they were issued, and a
    caller's next command (issued after its previous one was answered, even when the caller was
    cancelled: `_answered`) lands in a later flush.
    Mixed into a redis-py client class, before it."""

    _pending: list[_Pending]
    _turn: asyncio.Future[None]  # done once the flush of the pending commands has ended
    _sending: set[asyncio.Task[None]]  # held, so no flush is collected mid-way
    _merges: dict[str, tuple[str, Merge]]  # the script's text and merge, by its SHA

    def _start_batching(self) -> None:
        self._pending = []
        self._sending = set()
        self._merges = {}

    def merge(self, script: str, merge: Merge) -> None:
        """Send the calls of `script` one flush holds as `merge` makes them (fewer calls: a
        merged call stands where the first of its calls stood)."""
        self._merges[_sha(script)] = (script, merge)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if str(args[0]).upper() in _DIRECT:
            return await super().execute_command(*args, **options)  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
            self._turn = loop.create_future()
        self._pending.append((args, options, future))
        return await _answered(future, self._turn)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        # its own context: the flush serves every caller of the turn, not the first one's trace
        task = asyncio.get_running_loop().create_task(
            self._send(batch), context=contextvars.Context()
        )
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(partial(_cancel_unanswered, batch, self._turn))

    async def _send(self, batch: list[_Pending]) -> None:
        """One pipeline for the whole batch (a lone command sent as itself); a reply that is
        an error (a WAIT short of replicas: the writes to its node) fails its callers only, a
        connection that fails after retries fails every caller of the batch."""
        FLUSHES.inc()
        COMMANDS.inc(len(batch))
        sends = self._merged(batch)
        try:
            replies = await self._loaded_again(sends, await self._replies(sends))
        except Exception as exc:  # the callers see the error (a cancel: `_cancel_unanswered`)
            for *_, future in batch:
                if not future.done():  # its caller was cancelled meanwhile
                    future.set_exception(exc)
            return
        for (*_, parts), reply in zip(sends, replies, strict=True):
            for index, share in _shares(parts, reply):
                future = batch[index][2]
                if future.done():  # its caller was cancelled meanwhile
                    continue
                if isinstance(share, Exception):
                    future.set_exception(share)
                else:
                    future.set_result(share)

    async def _replies(self, sends: list[_Send]) -> list[Any]:
        """The replies, the commands a cluster node redirected (`REDIRECTS`: their slot moved)
        sent again once the slots are read anew (a write with its WAIT on the slot's new
        master); one still redirected after `RETRIES` times (a slot mid-migration) fails as the
        outage it is. redis-py's pipeline sent it again through this client's
        `execute_command`: into a later flush, to the same stale node, MOVED for ever."""
        replies = await self._sent(sends)
        for _ in range(RETRIES):
            moved = [index for index, reply in enumerate(replies) if isinstance(reply, REDIRECTS)]
            if not moved:
                return replies
            again = await self._sent([sends[index] for index in moved])
            for index, reply in zip(moved, again, strict=True):
                replies[index] = reply
        return [_moving(reply) if isinstance(reply, REDIRECTS) else reply for reply in replies]

    async def _sent(self, sends: list[_Send]) -> list[Any]:
        if len(sends) == 1 and not get_settings().replica_acks:
            # a lone command (a quiet producer's every flush) costs less without a pipeline
            args, options, _ = sends[0]
            try:
                return [await super().execute_command(*args, **options)]  # type: ignore[misc]
            except NoScriptError as refused:
                return [refused]
        return await self._pipelined(sends)

    async def _loaded_again(self, sends: list[_Send], replies: list[Any]) -> list[Any]:
        """The replies once the merged calls a server refused for lacking their script (NOSCRIPT:
        it restarted since) are sent again, as they were: a call that ran before its reply was
        lost, and was retried onto the restarted server, must be rerun whole, for ENQUEUE to
        know it from its first job (each caller sending its own part again, merged anew with
        other jobs, enqueued those twice)."""
        refused = [
            index
            for index, ((args, _, _), reply) in enumerate(zip(sends, replies, strict=True))
            if isinstance(reply, NoScriptError) and _merged_script(args, self._merges)
        ]
        if not refused:
            return replies
        shas = {sends[index][0][1] for index in refused}
        again = [sends[index] for index in refused]
        try:
            await preload(cast(RedisClient, self), [self._merges[sha][0] for sha in shas])
            resent = await self._replies(again)
        except Exception as exc:  # theirs alone: the rest of the flush ran and keeps its replies
            resent = [exc] * len(again)
        for index, reply in zip(refused, resent, strict=True):
            replies[index] = reply
        return replies

    async def _pipelined(self, sends: list[_Send]) -> list[Any]:
        pipe: Any = self.pipeline(transaction=False)  # type: ignore[attr-defined]
        for args, options, _ in sends:
            pipe.execute_command(*args, **options)
        written = (
            [_written_key(args) for args, _, _ in sends] if get_settings().replica_acks else []
        )
        keys = [key for key in written if key is not None]
        nodes = await queue_replica_waits(cast(RedisClient, self), pipe, keys)
        replies = await executed(pipe, raise_on_error=False, follows=False)
        return _acked(written, nodes, replies) if nodes else replies

    def _merged(self, batch: list[_Pending]) -> list[_Send]:
        """The batch's commands, each with the (index, share) of the callers its reply is for;
        the calls of a script with a merge (`merge`) merged, where the first of them stood."""
        scripts: dict[str, list[int]] = {}  # the flush's calls of each script with a merge
        for index, (args, options, _) in enumerate(batch):
            if _merged_script(args, self._merges) and not options:
                scripts.setdefault(args[1], []).append(index)
        firsts = {calls[0]: sha for sha, calls in scripts.items()}
        merging = {index for calls in scripts.values() for index in calls}
        sends: list[_Send] = []
        for index, (args, options, _) in enumerate(batch):
            if index not in merging:
                sends.append((args, options, [(index, WHOLE)]))
            elif sha := firsts.get(index):
                calls = scripts[sha]
                merged = self._merges[sha][1]([_script_call(batch[i][0]) for i in calls])
                for (keys, script_args), parts in merged:
                    command = ("EVALSHA", sha, len(keys), *keys, *script_args)
                    sends.append((command, {}, [(calls[i], items) for i, items in parts]))
        return sends


class GroupCommitRedis(GroupCommit, ResendsSafely):  # type: ignore[misc]
    """Group commit over one server's pool, shared with the client it was made from (closed
    with it). Its flushes, a lone command or a pipeline, are sent again through a lost
    connection only where a second run changes nothing, as the client's own commands are
    (`RUNS_TWICE`): a counter in a flush whose reply was lost counted twice."""

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        super().__init__(connection_pool=pool)
        self._start_batching()


class GroupCommitCluster(GroupCommit, HiredisCluster):  # type: ignore[misc]
    """Group commit over a cluster: a cluster client of its own (a cluster client's node pools
    cannot be shared), made by `connect` like every other."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self._start_batching()
