"""One way to open a Redis client, so every process behaves the same under load, through a
server restart, through a cluster failover and while Redis is frozen: commands that retry through
dropped connections (`from_url` alone gives connections that never retry, so the first request
after a restart would fail), and socket, connect and pool-wait timeouts of
`CONVEYOR_REDIS_TIMEOUT_S`, so a Redis that stops answering is an error in seconds (the
producer's 503), never a hang.

`CONVEYOR_REDIS_CLUSTER=1` makes every client a `RedisCluster` on `CONVEYOR_REDIS_URL` (any node
of the cluster: the rest is discovered), and on the nodes `CONVEYOR_REDIS_CLUSTER_NODES` names
too, so a process starts while the URL's node is down. Keys are named so that nothing a script
or a transaction touches spans slots (shared/keys.py), so the same calls work against one server
and a cluster; `RedisClient` is the one type both sides annotate with.

Three kinds of call are sent once, never again by redis-py on a lost connection: a command that
a second run changes the outcome of, alone or in a pipeline (`RUNS_TWICE`: a counter, an
append), a worker's reads of its consumer group (`sent_once`), and a cluster pipeline that
carries a replica WAIT (`queue_replica_wait`). A read the server served whose reply was lost,
sent again unseen, hid the outage from the loop that claims such entries back (they sat pending
a visibility timeout); a pipeline sent again lost its WAIT's target (redis-py pops it as it
routes), so the WAIT ran on the default node, on a connection that wrote nothing, and passed
whatever the replicas held.
Nor are the writes of such a pipeline that a node redirected (its slot moved) sent again alone,
without the WAIT. `run_pipeline` builds such a pipeline anew and runs it again instead."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeAlias, TypeVar, cast

import hiredis
import redis
import redis.asyncio as aioredis
import redis.retry
from redis._parsers.base import BaseParser
from redis.asyncio.cluster import (
    ClusterNode,
    ClusterPipeline,
    PipelineStrategy,
    RedisCluster,
    TransactionStrategy,
)
from redis.asyncio.connection import AbstractConnection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import PRIMARY
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    ClusterError,
    DataError,
    MasterDownError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisClusterUnreachableError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.settings import get_settings

# A cluster client answers the same commands; scripts, pipelines and pub/sub differ where noted
# (`is_cluster`, `preload`, producer_api/reply_listener.py).
RedisClient: TypeAlias = aioredis.Redis
T = TypeVar("T")


class ScriptKeyMoved(ResponseError):
    """A script refused mid-run a key it does not declare that its slot's migration has moved
    already (the job scripts find job hashes from stream entries, `LUA_JOB_KEY`): a state that
    passes once the slot has moved, where a plain ResponseError ended the worker (every worker
    of a partition that a reshard moved). A ResponseError, so redis-py never sends it again:
    the script may have written before the refusal."""


# What an ERR reply of a script refused a key moving says (Valkey: "Attempted to access …",
# Redis: "Script attempted to access …"), followed by where in the script.
NON_LOCAL_KEY = "to access a non local key in a cluster node"


class _ErrReplies(dict[str, type[Exception]]):
    """redis-py's classes of ERR replies, found by the whole message; a script's refused key
    (`ScriptKeyMoved`) by what the message says, as it names the script's line too."""

    def get(self, message: str, default: Any = None) -> Any:
        if NON_LOCAL_KEY in message:
            return ScriptKeyMoved
        return super().get(message, default)


# What a cluster answers while a master fails over (no master for a slot yet, a slot moving):
# an outage like a dropped connection (503, back off), not a fault of the request.
CLUSTER_OUTAGE = (ClusterDownError, TryAgainError, SlotNotCoveredError, ScriptKeyMoved)
# A cluster node's reply to a command for a slot it does not serve now (resharding moved it, or
# is moving it). redis-py sends each such command of a pipeline again by itself, through its
# client's `execute_command`: unless the pipeline is run without (`executed`), where they stay
# replies and the slots are read anew before the next command.
REDIRECTS = (MovedError, AskError, TryAgainError)
# Redis out of reach for now, on one server or a cluster (ClusterUnreachable is a
# RedisConnectionError): a request's 503, a stream's cut.
OUT_OF_REACH = (RedisConnectionError, RedisTimeoutError, *CLUSTER_OUTAGE)


class PersistenceError(RedisConnectionError):
    """MISCONF: the server refuses writes because it could not persist them (an RDB save or an
    AOF write failed: a full or lost disk). redis-py maps no class to it: a plain ResponseError
    was a 500, and ended a worker (kombu calls a refused BRPOP unrecoverable). Registered with
    redis-py's parsers below as a connection error, as redis-py makes LOADING one: a state of
    the server that passes, so clients retry it on fresh connections and kombu reconnects."""


class RoleChangedError(RedisConnectionError):
    """UNBLOCKED: a blocking read (a worker's XREADGROUP BLOCK, kombu's BRPOP) cut short because
    the server turned replica (a failover behind one address). A plain ResponseError in
    redis-py, it stopped a worker's consumer; as a connection error it is retried and backed
    off like an outage."""


class ReplicaRefusal(ReadOnlyError, RedisConnectionError):
    """READONLY: still a ReadOnlyError, and a connection error as well for kombu, which then
    reconnects (to the new master, once the address has one) where a ReadOnlyError on its
    BRPOP or its scripts ended the worker as unrecoverable."""


class ReplicasMissing(RedisConnectionError):
    """NOREPLICAS: a server with `min-replicas-to-write` refuses writes while too few replicas
    are connected. A plain ResponseError in redis-py, it ended a worker's consumer mid
    write-back (its results lost until reclaimed) and then its restart (XGROUP CREATE is a
    write); a state that passes, waited out like an outage."""


class ScriptBusy(RedisConnectionError):
    """BUSY: the server runs a script past its time limit and answers nothing else until the
    script ends or is killed; as NOREPLICAS, waited out rather than ending the worker."""


BaseParser.EXCEPTION_CLASSES.update(
    ERR=_ErrReplies(cast(dict[str, type[Exception]], BaseParser.EXCEPTION_CLASSES["ERR"])),
    MISCONF=PersistenceError,
    UNBLOCKED=RoleChangedError,
    READONLY=ReplicaRefusal,
    NOREPLICAS=ReplicasMissing,
    BUSY=ScriptBusy,
)
# A server that takes no writes for a while: the old master of a failover behind one address
# (a managed Redis's endpoint; READONLY, MASTERDOWN), one at its maxmemory with noeviction (OOM),
# one that cannot write to its disk (MISCONF). An outage too (503, back off); a failover's
# errors also drop the connection and retry it, so the address's new master is found.
FAILOVER_REFUSALS = (ReadOnlyError, MasterDownError)
WRITES_REFUSED = (*FAILOVER_REFUSALS, OutOfMemoryError, PersistenceError, ReplicasMissing)
# Per node: a cluster node's pool raises rather than waits when it is exhausted.
CLUSTER_CONNECTIONS = 1_024
# What a cluster client tries again, the topology read anew first: a lost connection, a slot
# without a master yet (a failover). redis-py's own list adds timeouts, and its loop ignores
# the client's Retry: a frozen master cost four timeouts, and each command sent again ran too
# once it woke (a TAKE twice: entries left pending that this consumer never held).
CLUSTER_RETRIED: tuple[type[Exception], ...] = (
    RedisConnectionError,
    ClusterDownError,
    SlotNotCoveredError,
)
# How many times a client `connect` made sends a command again through lost connections, after
# what pauses, for what errors (not timeouts, which redis-py's default adds: a cluster's loop
# has its own list, `CLUSTER_RETRIED`); a `blocking_client` too.
RETRIES = 3
RESEND_BACKOFF = ExponentialWithJitterBackoff(base=0.02, cap=1.0)
RESENT_ERRORS = (RedisConnectionError, *FAILOVER_REFUSALS)
# redis-py's pause before it sends a cluster pipeline again; `run_pipeline`'s too.
RESEND_PAUSE_S = 0.25
_SENT_ONCE: ContextVar[bool] = ContextVar("sent_once", default=False)


class CallerRetry(Retry):
    """The Retry of a client `connect` made, which a caller turns off for the calls it makes
    inside `sent_once()`: one server's connections and a cluster client's loops ask it."""

    def get_retries(self) -> int:
        return 0 if _SENT_ONCE.get() else super().get_retries()

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        if not _SENT_ONCE.get():
            return await super().call_with_retry(do, fail, is_retryable, with_failure_count)
        try:
            return await do()
        except self._supported_errors as error:
            # the connection is dropped as before a retry (a replica's is, so the next call
            # finds the address's new master)
            await (fail(error, 1) if with_failure_count else fail(error))
            raise


# Commands that a second run changes the outcome of: a counter counts twice, an append adds
# twice, a pop takes one more. Sent again after a lost connection whose reply was lost (the
# server ran it), a failed login counted twice and a canary's event was logged twice, so one is
# sent once, and so is any pipeline that carries one; its caller meets the lost connection.
# Scripts are sent again: those that write detect their reruns (shared/job_scripts.py).
RUNS_TWICE = frozenset(
    {
        *("INCR", "INCRBY", "INCRBYFLOAT", "DECR", "DECRBY", "HINCRBY", "HINCRBYFLOAT"),
        *("ZINCRBY", "XADD", "RPUSH", "LPUSH", "RPUSHX", "LPUSHX", "APPEND"),
        *("LPOP", "RPOP", "SPOP", "LMOVE", "RPOPLPUSH", "LMPOP", "ZPOPMIN", "ZPOPMAX"),
    }
)


def _once_where_one_runs_twice(names: Iterable[Any]) -> contextlib.AbstractContextManager[None]:
    """`sent_once()` where one of the commands `names` is of `RUNS_TWICE`, else nothing. A
    cluster pipeline's redirected command is still sent again, alone: its node ran nothing."""
    if any(str(name).upper() in RUNS_TWICE for name in names):
        return sent_once()
    return contextlib.nullcontext()


@contextlib.contextmanager
def sent_once() -> Iterator[None]:
    """Commands sent inside (by this task) are not sent again by redis-py on a lost connection:
    the error reaches the caller. For reads that hand work over (a consumer group's): one the
    server served whose reply was lost must be seen as the outage it is."""
    token = _SENT_ONCE.set(True)
    try:
        yield
    finally:
        _SENT_ONCE.reset(token)


class _KeepsCancel:
    """Around each Redis call of a client `connect` makes: a cancel of this task during the call
    (`cancelling()` grew) that did not come out of it as CancelledError is raised as one, from
    the Redis timeout or connection error redis-py raised in its place (under Python 3.11, a
    socket timeout's `asyncio.timeout` or `wait_for` racing the cancel), or after a call that
    returned all the same (a retry of that error answered, or a `wait_for` that swallowed it).
    A loop that waits out an outage took the error for one and ran on for good. A call whose
    task was cancelled before it (a clean-up after a cancel) gets its errors as they came, and
    so does a task not being cancelled (a timeout's own cancel is taken back before redis-py
    raises)."""

    __slots__ = ("before", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.before = 0 if self.task is None else self.task.cancelling()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if self.task is None or self.task.cancelling() <= self.before:
            return
        if error is None:
            raise asyncio.CancelledError
        if isinstance(error, RedisConnectionError | RedisTimeoutError):
            raise asyncio.CancelledError from error


class ResendsSafely(aioredis.Redis):
    """A client whose commands and pipelines are sent again through a lost connection only
    where a second run changes nothing (`RUNS_TWICE`), and whose errors under a cancel are the
    cancel (`_KeepsCancel`)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        with _KeepsCancel(), _once_where_one_runs_twice(args[:1]):
            return await super().execute_command(*args, **options)

    def pipeline(
        self, transaction: bool = True, shard_hint: str | None = None
    ) -> aioredis.client.Pipeline:
        return PipelineResendsSafely(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


class PipelineResendsSafely(aioredis.client.Pipeline):
    """A pipeline (a transaction too) that redis-py sends again whole through a lost
    connection only where none of its commands is of `RUNS_TWICE`."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        with _KeepsCancel(), _once_where_one_runs_twice(args[0] for args, _ in self.command_stack):
            return await super().execute(raise_on_error)


class HiredisPacking(AbstractConnection):
    """Commands packed in C by hiredis, arguments and all: redis-py 8.2's asyncio connections
    pack with hiredis too, but encode every argument in Python first (37 against 8 µs for a
    submit's script call of some 35 arguments; a tenth of a producer's CPU per job before). The
    bytes are the same: hiredis encodes str as UTF-8 and numbers as redis-py's encoder does."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _carries_a_large_argument(args):
            return self._pack_command_python(*args)
        first = args[0]
        if isinstance(first, str):  # a command name of several words ('SCRIPT LOAD')
            args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # what redis-py's encoder refuses, it refuses too
            raise DataError(str(exc)) from exc


def _carries_a_large_argument(args: tuple[Any, ...]) -> bool:
    """Results of a micro-batch (embeddings: megabytes) pack faster in Python: redis-py sends an
    argument past its buffer cutoff as a chunk of its own, where hiredis copies every argument
    into one growing buffer (15 MB of embeddings: 19 ms against 5.6 ms)."""
    return any(arg.__class__ in _TEXT and len(arg) > LARGE_ARGUMENT for arg in args)


_TEXT = (str, bytes)
LARGE_ARGUMENT = 1 << 16


class WritesInTurn(AbstractConnection):
    """A command written when it is sent, not a loop turn later: redis-py bounds the write with
    `asyncio.wait_for`, which under Python 3.11 runs it as a task of its own, queued behind
    everything else ready to run (on a producer, every other request of the turn). The bound
    is `asyncio.timeout` here, and what a failed write raises is redis-py's."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not (self.is_connected and self.socket_timeout and isinstance(command, list)):
            await super().send_packed_command(command, check_health)
            return
        if check_health:
            await self.check_health()
        try:
            async with asyncio.timeout(self.socket_timeout):
                await self._send_packed_command(command)
        except OSError as exc:
            await self.disconnect(nowait=True)
            # The bound's timeout has no errno; the OS's (ETIMEDOUT: TCP gave up on the peer)
            # is a dead connection, sent again on a new one, not a slow server.
            if isinstance(exc, TimeoutError) and exc.errno is None:
                raise RedisTimeoutError("Timeout writing to socket") from None
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            await self.disconnect(nowait=True)
            raise


class HiredisConnection(WritesInTurn, HiredisPacking, aioredis.Connection):
    pass


class HiredisUnixConnection(WritesInTurn, HiredisPacking, UnixDomainSocketConnection):
    pass


class HiredisSSLConnection(WritesInTurn, HiredisPacking, SSLConnection):
    pass


# The connection class a URL's scheme selects, and the same class packing with hiredis.
_HIREDIS_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {
    aioredis.Connection: HiredisConnection,
    UnixDomainSocketConnection: HiredisUnixConnection,
    SSLConnection: HiredisSSLConnection,
}


class UncontendedPool(aioredis.BlockingConnectionPool):
    """A blocking pool whose uncontended take and return go straight to its lists: redis-py's
    own pass through the pool's condition, a timeout armed and cancelled, and its pool
    telemetry every time, a quarter of a command's client CPU (~15 of 60 µs per round trip).
    While a caller waits for a connection (the pool exhausted), the pool is in maintenance
    mode or its lock is held (a re-authentication or maintenance handler rewriting the pool),
    every take and return is BlockingConnectionPool's, so the waiters are served in turn. A
    taken connection goes through redis-py's own check (`ensure_connection`). Its lists, lock
    and maintenance flag are redis-py 8.2's (pyproject's floor)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        if not self._available_connections or self._contended():
            self._waiting += 1
            try:
                return cast(AbstractConnection, await super().get_connection())
            finally:
                self._waiting -= 1
        connection = self._available_connections.pop()
        self._in_use_connections.add(connection)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        if self._contended():
            await super().release(connection)
            return
        self._in_use_connections.remove(connection)
        if connection.should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)

    def _contended(self) -> bool:
        return bool(self._waiting or self._in_maintenance or self._lock.locked())


class ClusterUnreachable(RedisConnectionError):
    """No node answered the cluster's topology query (or those that did left slots uncovered).
    redis-py raises a RedisClusterException, which is no RedisError: a cluster that was down was
    a 500, a producer that could not start, a worker that exited, where it is an outage (503,
    back off, recover). So does a command or pipeline of a client that had read the topology:
    once its nodes are all gone (RedisClusterUnreachableError), or once the slot it asked for
    lost its master (the read redis-py makes on CLUSTERDOWN finds the slot uncovered)."""


@contextlib.contextmanager
def topology_read() -> Iterator[None]:
    """What a topology read raises, as an outage when it is one: no node answered, or the
    nodes that did leave slots uncovered. Anything else (a URL of a server that is no cluster
    node) stays the error it is, so a misconfigured process fails at start, not as a 503."""
    try:
        yield
    except RedisClusterException as exc:
        if _unreachable(exc):
            raise ClusterUnreachable(str(exc)) from exc
        raise


def _unreachable(error: RedisClusterException) -> bool:
    """An outage that passes (no node answered, a slot without a master), not a misconfiguration
    (a URL of a server that is no cluster node, credentials the nodes refuse: redis-py's
    AuthenticationError is a ConnectionError), which must fail as itself."""
    cause = error.__cause__
    return (
        isinstance(error, RedisClusterUnreachableError)
        or (
            isinstance(cause, RedisConnectionError | RedisTimeoutError | OSError)
            and not isinstance(cause, AuthenticationError)
        )
        or "not covered" in str(error)
    )


class CredentialsRefused(RedisError):
    """The server refused the client's credentials (a wrong password, none where one is asked
    for). redis-py raises that as a ConnectionError, which every backoff waits out as an outage:
    at start it is a misconfiguration no wait mends (`credentials_checked`)."""


@contextlib.contextmanager
def credentials_checked() -> Iterator[None]:
    """A process's first commands, whose refused login is raised as CredentialsRefused, no
    outage: the worker waited for a wrong password for its whole start timeout. A running
    process's commands are left out: a password rotated under it is waited out."""
    try:
        yield
    except (AuthenticationError, RedisClusterException) as exc:
        # a cluster's nodes refusing them come as its layout unread, the refusal its cause
        refused = exc if isinstance(exc, AuthenticationError) else exc.__cause__
        if not isinstance(refused, AuthenticationError):
            raise
        raise CredentialsRefused(
            f"Redis refused CONVEYOR_REDIS_URL's credentials: {refused}"
        ) from exc


class RedirectsExhausted(TryAgainError):
    """A command whose slot kept redirecting it for redis-py's whole budget (16 tries, a few
    tenths of a second): mid-migration, a script or a multi-key command whose keys are split
    between the slot's two masters (`TRYAGAIN` until `MIGRATE` has moved them all), a submit
    while a partition's jobs move. redis-py raised a bare ClusterError, no outage: a 500 for
    the submit, not the 503 a slot in flux is. A TryAgainError, it is one (`CLUSTER_OUTAGE`)."""


# The node whose next command a task's ASKING allows (`AskingNode`).
_ASKED: ContextVar[ClusterNode | None] = ContextVar("asked", default=None)
# Commands that run a script, which may touch keys it does not declare (`AskingNode`).
SCRIPT_COMMANDS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})


class ScriptHeldBack(TryAgainError):
    """A script an ASK would send on to the importing master while its slot migrates: it
    waits, as TRYAGAIN does, until the slot has moved (MOVED then takes it there whole), and
    is the outage a moving slot is if it takes longer (`RedirectsExhausted`)."""


class AskingNode(ClusterNode):
    """A node that sends ASKING on the connection of the command it allows, in one write.
    redis-py sends it as a command of its own, and the command next on whichever connection
    the node's pool hands out first (a queue: not the one ASKING went on): on a node with more
    than one idle connection (any busy process's) the command came without ASKING, the
    importing master answered MOVED back to the old one, which answered ASK again, until
    redis-py gave up ("TTL exhausted", a ClusterError: a 500, a worker's error) on every key
    already migrated while a slot moved.

    A script is not sent on by ASK (`ScriptHeldBack`). The old master asks only once every key
    the script declares has moved, but the job scripts also touch keys they find in stream
    entries (`LUA_JOB_KEY`), which may not have: on the importing master those read as
    missing (TAKE handed a worker its lane's jobs as gone, and the worker dropped them) or
    are written anew beside the old master's (which MIGRATE then refuses: BUSYKEY)."""

    __slots__ = ()  # ClusterNode's layout, so that a node made by redis-py can become one

    async def execute_command(self, *args: Any, asking: bool = False, **kwargs: Any) -> Any:
        if args == ("ASKING",):
            _ASKED.set(self)  # sent with this task's next command to this node
            return True
        if _ASKED.get() is not self:
            return await super().execute_command(*args, asking=asking, **kwargs)
        _ASKED.set(None)
        if str(args[0]).upper() in SCRIPT_COMMANDS:
            raise ScriptHeldBack(f"{args[0]} waits for its slot to finish moving to {self.name}")
        return await self._asked(*args, **kwargs)

    async def _asked(self, *args: Any, **kwargs: Any) -> Any:
        """The command's reply, sent behind ASKING on one connection."""
        connection = self.acquire_connection()
        try:
            await self.disconnect_if_needed(connection)
            await connection.send_packed_command(connection.pack_commands([("ASKING",), args]))
            refused: ResponseError | None = None
            try:
                await connection.read_response()
            except ResponseError as exc:  # the command's reply is still to be read
                refused = exc
            reply = await self.parse_response(connection, args[0], **kwargs)
            if refused is not None:
                raise refused
            return reply
        finally:
            try:
                await self.disconnect_if_needed(connection)
            finally:
                self.release(connection)


class HiredisCluster(RedisCluster):
    """A cluster client whose node connections pack with hiredis too. RedisCluster fixes their
    class (Connection, or SSLConnection for `rediss://`) in the keyword arguments it builds
    every node from, startup nodes and nodes found later alike, with no parameter for it. Its
    topology reads (before a first command, after a failed one) fail as ClusterUnreachable, as
    do its commands and pipelines that such a read ended (`topology_read`).
    A timeout is raised after one try, by a command and a pipeline alike (`CLUSTER_RETRIED`)."""

    ERRORS_ALLOW_RETRY: Any = CLUSTER_RETRIED  # typed by redis-py as its own four

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        node_kwargs = self.get_connection_kwargs()
        plain = cast(type[aioredis.Connection], node_kwargs["connection_class"])
        packing = cast(type[aioredis.Connection], _HIREDIS_PACKING.get(plain, plain))
        node_kwargs["connection_class"] = packing
        for node in self.startup_nodes:  # made before the swap
            node.connection_class = packing

    async def initialize(self, *args: Any, **kwargs: Any) -> HiredisCluster:
        with _KeepsCancel(), topology_read():
            await super().initialize(*args, **kwargs)
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        with _KeepsCancel(), topology_read(), _once_where_one_runs_twice(args[:1]):
            return await super().execute_command(*args, **kwargs)

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._execute_command(target_node, *args, **kwargs)
        except ClusterError as exc:
            if type(exc) is not ClusterError:  # ClusterDownError and its kin stay themselves
                raise
            raise RedirectsExhausted(f"slot still moving: {exc}") from exc

    def get_node(
        self, host: str | None = None, port: int | None = None, node_name: str | None = None
    ) -> ClusterNode | None:
        """The node, an `AskingNode`: redis-py looks up by address the node an ASK names, and
        sends it ASKING. One by address that the slots read last did not name is added, a
        master (the importing one of an ASK: a master added since, that slots are moving to),
        as redis-py adds the node a MOVED names; it looked the node up as None and failed
        with an AttributeError."""
        node = super().get_node(host, port, node_name)
        if node is None and host and port:
            kwargs: dict[str, Any] = self.get_connection_kwargs()
            node = ClusterNode(host, port, PRIMARY, **kwargs)
            self.nodes_manager.set_nodes(self.nodes_manager.nodes_cache, {node.name: node})
        if node is not None and type(node) is ClusterNode:
            node.__class__ = AskingNode  # no state of its own: the same node, asking as one
        return node

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        """redis-py's pipelines try again what the base RedisCluster's list names, whatever
        this class's: theirs are swapped for ones that raise a timeout."""
        pipe = super().pipeline(transaction, shard_hint)
        strategy = TimeoutRaisingTransaction if transaction else TimeoutRaisingPipeline
        pipe._execution_strategy = strategy(pipe)
        return pipe


class NotResent(RedisConnectionError):
    """A cluster pipeline that carries a WAIT lost a connection (or met a slot without a
    master, or one that moved) and was not sent again (`TimeoutRaisingPipeline`): an outage to
    its caller, which `run_pipeline` builds anew and runs again. Never a server's refusal
    (NOREPLICAS, MISCONF, BUSY, READONLY, LOADING): that reaches the caller as itself, so the
    producer's 503 names it (and its Retry-After)."""


class _Carried(Exception):
    """An error carried past redis-py's pipeline loop, which would send the stack again."""

    def __init__(self, error: Exception, cause: BaseException | None) -> None:
        super().__init__(error)
        self.error = error
        self.cause = cause


class TimeoutRaisingPipeline(PipelineStrategy):
    """A cluster pipeline whose timeout is raised at once, the slots read again before the
    next command, as after a command's timeout. One that carries a WAIT (`resends` off) is not
    sent again by redis-py after any other error either: the WAIT's target would be lost. What
    redis-py would have sent it again for is then `NotResent` only where `_lost` says so; a
    refusal the server replied is raised as it came. Nor are its commands a node redirected
    (`REDIRECTS`): each would run alone on the slot's new master, without the WAIT (queued on
    the old one, where it proved nothing); the slots are read anew and the pipeline, raising
    its errors, is `NotResent`. A pipeline run without redirections keeps them as replies,
    the slots read anew too."""

    resends = True

    async def execute(self, *args: Any, **kwargs: Any) -> list[Any]:
        with _KeepsCancel():  # around what is carried too: a lost cancel comes out as that
            try:
                with (
                    topology_read(),
                    _once_where_one_runs_twice(c.args[0] for c in self._command_queue),
                ):
                    return await super().execute(*args, **kwargs)
            except _Carried as carried:
                raise carried.error from carried.cause

    async def _execute(
        self,
        client: RedisCluster,
        stack: list[Any],
        raise_on_error: bool = True,
        allow_redirections: bool = True,
    ) -> list[Any]:
        follows = allow_redirections and self.resends
        try:
            return await super()._execute(client, stack, raise_on_error, follows)
        except REDIRECTS as exc:  # not followed, or followed past the budget
            raise _Carried(NotResent(f"pipeline not sent again: {exc!r}"), exc) from exc
        except RedisTimeoutError as exc:
            client._initialize = True
            raise _Carried(exc, exc.__cause__) from exc
        except RedisCluster.ERRORS_ALLOW_RETRY as exc:
            if self.resends:
                raise
            client._initialize = True
            if not self._lost(exc):
                raise _Carried(exc, exc.__cause__) from exc
            raise _Carried(NotResent(f"pipeline not sent again: {exc!r}"), exc) from exc
        finally:
            if not follows and any(isinstance(cmd.result, REDIRECTS) for cmd in stack):
                client._initialize = True

    @staticmethod
    def _lost(error: Exception) -> bool:
        """Whether a pipeline is worth running again whole: a connection lost (no reply read;
        redis-py's parser gives each error reply its `status_code`) or a slot without a master
        (CLUSTERDOWN and MASTERDOWN, replies of a failover under way; a slot no node covers),
        which redis-py's own loops send again once the topology is read anew, a pipeline with
        no WAIT included. Refusals made connection errors (NOREPLICAS, MISCONF, BUSY, READONLY,
        LOADING) are states of a server that a rerun a moment later would meet again."""
        if isinstance(error, ClusterDownError | SlotNotCoveredError):
            return True
        return isinstance(error, RedisConnectionError) and error.status_code is None


class TimeoutRaisingTransaction(TransactionStrategy):
    """A cluster transaction whose timeout is raised at once: redis-py's adds the base class's
    list, timeouts included, to the client's Retry. One its slot still redirects after those
    tries (mid-migration: redis-py takes an ASK for a MOVED and sends no ASKING, so the old
    master and the importing one send it back and forth) is the outage a moving slot is
    (`RedirectsExhausted`), where the MovedError was a 500 (a file upload, a batch's create)."""

    def __init__(self, pipe: ClusterPipeline) -> None:
        super().__init__(pipe)
        self._retry = copy.copy(pipe.cluster_client.retry)
        self._retry.update_supported_errors(cast(Any, CLUSTER_RETRIED + self.SLOT_REDIRECT_ERRORS))

    async def execute(self, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            with (
                _KeepsCancel(),
                topology_read(),
                _once_where_one_runs_twice(c.args[0] for c in self._command_queue),
            ):
                return await super().execute(*args, **kwargs)
        except AskError as exc:  # a MovedError too
            raise RedirectsExhausted(f"transaction's slot still moving: {exc}") from exc


async def reread_topology(client: RedisClient) -> None:
    """Read a cluster's slots again now, not at its next failed command (a node was lost)."""
    with topology_read():
        await cast(Any, client).nodes_manager.initialize()


def connect(
    url: str,
    max_connections: int = 64,
    name: str | None = None,
    *,
    blocks_ms: int | None = None,
    timeout_s: float | None = None,
    cluster_class: type[RedisCluster] = HiredisCluster,
    cluster: bool | None = None,
) -> RedisClient:
    """A client whose commands retry a few times through dropped connections (jittered backoff
    capped at 1 s) before they raise (not those sent once: `sent_once`, a cluster pipeline with
    a WAIT, a command that a second run changes the outcome of and its pipeline: `RUNS_TWICE`);
    callers map what still fails to 503 or to their own backoff. A timeout is not retried, on
    one server or a cluster: it would multiply the wait on a frozen server, and send again a
    command the server may run once it wakes.

    `name` labels its connections in CLIENT LIST (a worker uses its consumer name).
    `blocks_ms` is the longest BLOCK its commands use (default `CONVEYOR_BLOCK_MS`, what a
    worker's reads block for; 0 for a client that never blocks): the socket timeout is
    `timeout_s` (default `CONVEYOR_REDIS_TIMEOUT_S`) beyond it, so no blocking read is cut.
    `cluster_class`: the RedisCluster subclass a cluster client is made as. `cluster`: whether
    `url` is a cluster's node (default `CONVEYOR_REDIS_CLUSTER`; the CLI's stack.json says it
    of the stack `conveyor up` runs), `CONVEYOR_REDIS_CLUSTER_NODES` its other seeds."""
    settings = get_settings()
    timeout = settings.redis_timeout_s if timeout_s is None else timeout_s
    block_s = (settings.block_ms if blocks_ms is None else blocks_ms) / 1000
    options: dict[str, Any] = {
        "client_name": name,
        "retry": CallerRetry(RESEND_BACKOFF, retries=RETRIES, supported_errors=RESENT_ERRORS),
        "health_check_interval": 15,
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout + block_s,
    }
    if settings.redis_cluster if cluster is None else cluster:
        # A failover moves slots: the client re-reads the topology on MOVED and connection
        # errors, for up to its retry attempts, before a command fails (503 upstream); a
        # timeout fails at once.
        client = cluster_class.from_url(
            url,
            startup_nodes=[ClusterNode(host, port) for host, port in settings.redis_cluster_nodes],
            max_connections=max(max_connections, CLUSTER_CONNECTIONS),
            topology_refresh_min_interval=0,
            **options,
        )
        return cast(RedisClient, client)
    pool = UncontendedPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,  # a burst waits for a free connection rather than failing
        retry_on_error=[RedisConnectionError, *FAILOVER_REFUSALS],
        **options,
    )
    pool.connection_class = _HIREDIS_PACKING.get(pool.connection_class, pool.connection_class)
    return ResendsSafely.from_pool(pool)  # the client owns its pool: aclose() closes both


class ChainedRetry(redis.retry.Retry):
    """A blocking client's Retry (`blocking_client`), whose error of each try has the error of
    the try before it as its context: the error it finally raises tells whether any try may
    have run (`may_have_run`). The last try's alone (a connection refused) said nothing was
    sent where a first try had run and lost its reply."""

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        earlier: list[Exception] = []

        def tried() -> T:
            try:
                return do()
            except Exception as exc:
                if earlier and earlier[-1] is not exc:
                    exc.__context__ = earlier[-1]
                earlier.append(exc)
                raise

        return super().call_with_retry(tried, fail, is_retryable, with_failure_count)


def may_have_run(error: BaseException) -> bool:
    """Whether a command of a blocking client (`blocking_client`) that failed with `error` may
    have run on the server: unless every try of it met a connection refused (or a name not
    resolved), which sent nothing."""
    while isinstance(error.__cause__, ConnectionRefusedError | socket.gaierror):
        if not isinstance(error.__context__, RedisError):
            return False
        error = error.__context__
    return True


def blocking_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client of the one server `url` names whose commands are sent again through
    a dropped connection, as `connect`'s are (a timeout is not: a frozen server). redis-py's
    `from_url` retries nothing, so a blip failed the command. Every command sent through it
    must be safe to run twice (its reply lost, it is sent again unseen)."""
    retry = ChainedRetry(RESEND_BACKOFF, retries=RETRIES, supported_errors=RESENT_ERRORS)
    return redis.Redis.from_url(url, retry=retry, **options)


def blocking_cluster(
    url: str, seeds: Iterable[tuple[str, int]], **options: Any
) -> redis.RedisCluster:
    """A blocking client of the cluster `url` names that also starts from `seeds`
    (`CONVEYOR_REDIS_CLUSTER_NODES`), so it comes up while the URL's node is down."""
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in seeds]
    return redis.RedisCluster.from_url(url, startup_nodes=nodes, **options)


def subscriber(client: RedisClient, node: tuple[str, int] | None = None) -> aioredis.Redis:
    """A client of its own for pub/sub on `client`'s server (a cluster: on its `node`), with
    the same connections but no retry: a pub/sub connection that retries reconnects and
    subscribes again unseen, and what was published meanwhile is lost to a listener that never
    heard of the gap (producer_api/reply_listener.py rechecks its waiters after each one)."""
    if node is None:
        pool: Any = client.connection_pool
        connection_class, kwargs = pool.connection_class, pool.connection_kwargs
    else:
        owner: Any = cast(Any, client).get_node(host=node[0], port=node[1])
        connection_class, kwargs = owner.connection_class, owner.connection_kwargs
    kwargs = {**kwargs, "retry": Retry(NoBackoff(), 0)}
    pool = aioredis.ConnectionPool(connection_class=connection_class, **kwargs)
    return Subscriber(connection_pool=pool)


class Subscriber(aioredis.Redis):
    """A client whose pub/sub keeps a cancel (`PubSubKeepsCancel`)."""

    def pubsub(self, **kwargs: Any) -> aioredis.client.PubSub:
        return PubSubKeepsCancel(self.connection_pool, **kwargs)


class PubSubKeepsCancel(aioredis.client.PubSub):
    """A subscription whose reads (`get_message`, `listen`), commands and reconnection raise a
    cancel lost inside them as the cancel (`_KeepsCancel`), as a client's commands do: its calls
    are not the client's. The reply listener's task, its cancel lost in a read as a Redis
    timeout, took it for an outage, reconnected and listened on; lost as a nil read, it read on,
    and a stop that cancels again lost each cancel there too."""

    async def parse_response(self, block: bool = True, timeout: float = 0) -> Any:
        with _KeepsCancel():
            return await super().parse_response(block, timeout)

    async def execute_command(self, *args: Any) -> Any:
        with _KeepsCancel():
            return await super().execute_command(*args)

    async def connect(self) -> None:
        with _KeepsCancel():
            await super().connect()


async def push_as_received(message: Any) -> Any:
    """A pub/sub push handler that passes each message on untouched. redis-py speaks RESP3 by
    default, and its own handler formats every pushed message into a debug log line, logged or
    not: ~285 µs for one reply of 32 embeddings (130 KB), 40 % of a producer's CPU in part G."""
    return message


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


async def preload(client: RedisClient, scripts: Iterable[str]) -> None:
    """Load scripts on every node, replicas included (one server: on it), so that the first
    EVALSHA of each finds them there and after a failover. A call that misses one anyway (a
    node restarted since) loads it and tries again: a script's own call by itself, a pipeline
    through `run_pipeline` or `run_script`.

    A cluster node out of reach is passed over, unless every node is: a replica that died is
    listed until the cluster marks it failed (`cluster-node-timeout`), and failing there
    failed every call that met NOSCRIPT meanwhile, and every process that started. The node
    gets the scripts once a call it refuses for lacking them loads them again."""
    texts = list(scripts)
    if not is_cluster(client):
        for script in texts:
            await client.script_load(script)
        return
    cluster = cast(Any, client)
    await cluster.initialize()  # knows its nodes before the first load (no-op after)
    nodes = cluster.get_nodes()
    loads = await asyncio.gather(
        *(_load_on(cluster, n, texts) for n in nodes), return_exceptions=True
    )
    failed = [out for out in loads if isinstance(out, BaseException)]
    for error in failed:
        if not isinstance(error, OUT_OF_REACH):
            raise error
    if failed and len(failed) == len(nodes):
        raise failed[0]


async def _load_on(cluster: Any, node: ClusterNode, scripts: list[str]) -> None:
    """Load `scripts` on `node`, stopping at its first error: a node out of reach costs one
    timeout, not one per script."""
    for script in scripts:
        await cluster.execute_command("SCRIPT LOAD", script, target_nodes=node)


class ReplicaAckTimeout(RedisConnectionError):
    """Fewer replicas than `CONVEYOR_REPLICA_ACKS` confirmed a write within the timeout: the
    write may not survive a failover, so it is not acknowledged (the producer's 503)."""


async def queue_replica_wait(client: RedisClient, pipe: Any, written: Iterable[str]) -> int:
    """Queue `WAIT CONVEYOR_REPLICA_ACKS` on `pipe` behind the writes it carries to the keys
    `written` (`queue_replica_waits`). Returns how many WAITs were queued (0 when acks are
    off); `check_replica_acks` reads their replies."""
    return len(set((await queue_replica_waits(client, pipe, written)).values()))


async def queue_replica_waits(
    client: RedisClient, pipe: Any, written: Iterable[str]
) -> dict[str, str]:
    """Queue `WAIT CONVEYOR_REPLICA_ACKS` on `pipe` behind the writes it carries to the keys
    `written`: on the connection of each of their nodes (a cluster; one server: its one), since
    WAIT counts only the writes of its own connection; none when nothing is written, so a read
    or another shard's lost replica never holds a write up. Returns the node of each key (its
    name; "" on one server), the WAITs queued in the order their nodes first appear (none when
    acks are off). A cluster pipeline with a WAIT is not sent again by redis-py, nor are the
    commands of it a node redirected (`TimeoutRaisingPipeline`; a client `connect` made).

    The WAIT gives up at half of `CONVEYOR_REDIS_TIMEOUT_S`: its reply (fewer replicas than
    asked) must come before the socket timeout of a client that never blocks, which is that
    timeout, and the server notices a WAIT's end on its cron (up to 100 ms late at hz 10). A
    WAIT the socket cut failed every command of its pipeline, reads and other nodes' too."""
    settings = get_settings()
    if settings.replica_acks == 0:
        return {}
    keys = list(written)
    if not keys:
        return {}
    args = ("WAIT", settings.replica_acks, int(settings.redis_timeout_s * 1000 / 2))
    if not is_cluster(client):
        pipe.execute_command(*args)
        return dict.fromkeys(keys, "")
    cluster = cast(Any, client)
    await cluster.initialize()  # knows its nodes before its first command (no-op after)
    nodes = {key: cluster.get_node_from_key(key) for key in keys}
    strategy = getattr(pipe, "_execution_strategy", None)
    if isinstance(strategy, TimeoutRaisingPipeline):
        strategy.resends = False
    for node in {node.name: node for node in nodes.values()}.values():
        pipe.execute_command(*args, target_nodes=node)
    return {key: node.name for key, node in nodes.items()}


def replica_shortfall(reply: Any) -> ReplicaAckTimeout | None:
    """The error of a WAIT whose reply fell short of `CONVEYOR_REPLICA_ACKS`, else None."""
    wanted = get_settings().replica_acks
    if isinstance(reply, int) and reply >= wanted:
        return None
    return ReplicaAckTimeout(f"fewer than {wanted} replicas confirmed the write: {reply!r}")


def check_replica_acks(replies: list[Any]) -> None:
    """Raise ReplicaAckTimeout unless every WAIT reply reached `CONVEYOR_REPLICA_ACKS`."""
    for reply in replies:
        if (short := replica_shortfall(reply)) is not None:
            raise short


def queue_script(pipe: Any, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue a script call beside other commands on a pipeline of either kind, as EVALSHA:
    neither the SCRIPT EXISTS round trip redis-py's pipelines send before each execution nor
    the script's text per call. Run the pipeline with `run_pipeline`, which loads a script a
    server lacks (one restarted or flushed since) and runs it again."""
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


async def run_pipeline(
    client: RedisClient, fill: Callable[[Any], Awaitable[T]], scripts: Sequence[AsyncScript]
) -> tuple[T, list[Any]]:
    """What `fill` returns and the replies of the pipeline it queued (the first error reply
    raised). A server that lacks one of `scripts` refuses its call with NOSCRIPT, which ran
    nothing: the scripts are then loaded everywhere and the whole pipeline runs once more, so
    what `fill` queues must be safe to run twice (a script refused, the rest repeated). So is
    one redis-py did not send again after a lost connection (`NotResent`: it carries a WAIT),
    filled anew, as many times as redis-py would have sent it."""
    try:
        return await _refilled(client, fill)
    except NoScriptError:
        await preload(client, [cast(str, script.script) for script in scripts])
        return await _refilled(client, fill)


async def _refilled(
    client: RedisClient, fill: Callable[[Any], Awaitable[T]]
) -> tuple[T, list[Any]]:
    for _ in range(RETRIES):
        with contextlib.suppress(NotResent):
            return await _filled(client, fill)
        await asyncio.sleep(RESEND_PAUSE_S)
    return await _filled(client, fill)


async def _filled(client: RedisClient, fill: Callable[[Any], Awaitable[T]]) -> tuple[T, list[Any]]:
    async with client.pipeline(transaction=False) as pipe:
        filled = await fill(pipe)
        return filled, await executed(pipe)


async def call_script(script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """`script(keys=keys, args=args)` on the client it was registered with, as one EVALSHA:
    redis-py's call first checks its client against a Protocol class (`isinstance`), 3 % of a
    producer's CPU per submit. A server that lacks the script (NOSCRIPT: the call ran nothing;
    it restarted since) gets it loaded everywhere, and the call again."""
    client = cast(RedisClient, script.registered_client)
    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    try:
        return await client.execute_command(*command)
    except NoScriptError:
        await preload(client, [cast(str, script.script)])
        return await client.execute_command(*command)


# A script call's keys and arguments.
ScriptCall = tuple[list[Any], list[Any]]
# Calls of one script sent as one: the call, and the (index, reply items) of each call it stands
# for, in order; its reply is a list of their replies' items.
MergedCall = tuple[ScriptCall, list[tuple[int, int]]]


async def run_script(
    client: RedisClient, script: AsyncScript, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """`script` once per (keys, args) of `calls`, pipelined in one round trip; the replies in
    order (an error reply is raised). Its text is not sent per call: the calls a server refused
    for lacking it (NOSCRIPT: they did nothing; it restarted since it was loaded) run again
    once it is loaded everywhere. Only those: each call must run once."""
    replies = await _evalsha_each(client, script, calls)
    missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        await preload(client, [cast(str, script.script)])
        again = await _evalsha_each(client, script, [calls[index] for index in missing])
        for index, reply in zip(missing, again, strict=True):
            replies[index] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def _evalsha_each(
    client: RedisClient, script: AsyncScript, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return await executed(pipe, raise_on_error=False)


async def read_streams(
    client: RedisClient,
    streams: Mapping[Any, Any],
    count: int,
    block_ms: int | None = None,
    group: tuple[str, str] | None = None,
) -> Any:
    """XREAD of `streams` (each key's cursor), or XREADGROUP as `group` (group, consumer), as
    redis-py's `xread`/`xreadgroup` answer. A cluster client sends it to the first stream's
    node itself: the keys of these commands move, and redis-py would first ask COMMAND GETKEYS
    of one node it fixed at start, a round trip per read that fails for good once that node
    dies (every read of a worker whose startup node failed over would fail)."""
    pieces: list[Any] = ["GROUP", *group] if group else []
    pieces += ["COUNT", count]
    if block_ms is not None:
        pieces += ["BLOCK", block_ms]
    pieces += ["STREAMS", *streams.keys(), *streams.values()]
    command = "XREADGROUP" if group else "XREAD"
    if not is_cluster(client):
        return await client.execute_command(command, *pieces)
    cluster = cast(Any, client)
    await cluster.initialize()  # after a failover: the slots' new owners (no-op otherwise)
    node = cluster.get_node_from_key(next(iter(streams)))
    return await cluster.execute_command(command, *pieces, target_nodes=node)


async def hgetall_many(client: Any, keys: Sequence[str]) -> list[dict[Any, Any]]:
    """Each hash's fields (empty where there is none) in one pipelined round trip, not one per
    key (a cluster pipeline is split per node)."""
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hgetall(key)
        return await executed(pipe)


async def executed(pipe: Any, raise_on_error: bool = True, follows: bool = True) -> list[Any]:
    """The pipeline's replies. redis-py's cluster pipeline can fail with an AttributeError or a
    RuntimeError (a closed transport) when a node's connection is torn down under it in a
    failover: that is a lost connection (503, back off), not a fault of the caller. `follows`
    False: a cluster's redirect replies (`REDIRECTS`) are left as replies, not sent again one
    by one through the client's `execute_command`; the slots are read anew (a client `connect`
    made: `TimeoutRaisingPipeline`)."""
    unfollowed = not follows and isinstance(pipe, ClusterPipeline)
    options = {"allow_redirections": False} if unfollowed else {}
    try:
        return list(await pipe.execute(raise_on_error=raise_on_error, **options))
    except (AttributeError, RuntimeError) as exc:
        raise RedisConnectionError(f"connection lost mid-pipeline: {exc!r}") from exc
