"""One blocking XREAD per producer and partition for every token stream its clients follow
(SSE and OpenAI streaming): an open stream costs a queue, not a Redis connection held in a
blocking read, and one read returns the new entries of many streams at once. A read spans one
slot (a cluster refuses more), and a partition's token streams share its slot, so the hub keeps
one reader per partition tag, started when the first of its streams is followed. A listener on
a stream a reader does not read yet wakes it through a small per-producer stream in the same
slot that the reader always reads.

The read is shared, so no listener's input may fail it: the hub accepts only valid entry ids as
cursors, and should Redis still refuse the read for a key that is no stream, the streams it
refuses so are found and dropped, each listener of theirs told, while every other stream goes
on. A refusal of the server's own (BUSY, CLUSTERDOWN, NOPERM, a write refused at start) drops
nothing: the reader waits it out as it waits out an outage, and never stops."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from producer_api.redis_outage import RedisOutage
from producer_api.task_cancel import cancel_and_wait
from shared.codec import as_text, is_stream_id, stream_id
from shared.job_store import JobRecord, JobStore
from shared.keys import Keys, job_tag
from shared.redis_client import RedisClient, connect, is_cluster, read_streams
from shared.token_stream import READ_COUNT, TokenEvent, confirms, final_from_job, retold

log = logging.getLogger(__name__)
Rows = list[tuple[Any, Any]]


class StreamUnreadable(ResponseError):
    """Redis refused to read a followed stream; its listeners get this instead of rows (and
    raise it as the refusal it is)."""


class Behind:
    """In place of the rows a listener fell too far behind to be kept: it reads them again
    from Redis."""


BEHIND = Behind()
Delivery = Rows | StreamUnreadable | Behind
# Deliveries kept for a listener that does not take them (its client stopped reading): they
# grew by every step of its job, for as long as the job ran, held in the producer's memory.
LISTENER_BACKLOG = 32
NO_STREAM = "WRONGTYPE"  # the one refusal of a read that is a key's fault, not the server's
HUB_BLOCK_MS = 5000  # a read returns sooner whenever any followed stream (or the wake) grows
WAKE_MAXLEN = 64
WAKE_TTL_S = 86_400
START = "0-0"  # a stream read from its first entry
FINISH_GRACE_S = 0.005  # first wait to see FINISH confirm a final: a live worker is ~1 ms behind


class TokenHub:
    """The producer's readers of token streams, one per partition tag."""

    def __init__(self, url: str, client: RedisClient, keys: Keys, producer: str) -> None:
        self.redis = client  # the shared pool: short reads
        self.url = url
        self.keys = keys
        self.producer = producer
        self._readers: dict[str, TagReader] = {}

    async def start(self, tags: Iterable[str]) -> None:
        """Start the readers of the partitions known to stream tokens (the repository's
        generate models); any other starts when its first stream is followed."""
        for tag in tags:
            await self._reader(tag)

    async def stop(self) -> None:
        for reader in self._readers.values():
            await reader.stop()

    @asynccontextmanager
    async def listen(
        self, tag: str, key: str, after: str
    ) -> AsyncIterator[asyncio.Queue[Delivery]]:
        """`TagReader.listen` on the reader of `key`'s partition `tag`."""
        reader = await self._reader(tag)
        async with reader.listen(key, after) as queue:
            yield queue

    async def _reader(self, tag: str) -> TagReader:
        if tag not in self._readers:
            wake = self.keys.token_hub_wake(self.producer, tag)
            name = f"producer-{self.producer}-tokens-{tag}"
            reader = TagReader(self.url, self.redis, wake, name)
            self._readers[tag] = reader
            await reader.start()
        return self._readers[tag]

    async def read(self, key: str, after: str, count: int) -> Any:
        """Up to `count` entries of `key` after `after`, now, without blocking (the shared
        pool, not a blocking reader)."""
        return await read_streams(self.redis, {key: after}, count)

    async def holds(self, key: str, entry_id: str) -> bool:
        """Whether `key` holds an entry `entry_id`."""
        return bool(await self.redis.xrange(key, entry_id, entry_id, count=1))

    async def last(self, key: str, before: str | None = None) -> TokenEvent | None:
        """`key`'s last entry now, or its last before the id `before` (None: it holds none)."""
        newest = "+" if before is None else f"({before}"
        rows: Any = await self.redis.xrevrange(key, newest, count=1)
        return TokenEvent.decode(*rows[0]) if rows else None


class TagReader:
    """The blocking reader of one partition's token streams (and its wake stream)."""

    def __init__(self, url: str, client: RedisClient, wake_key: str, name: str) -> None:
        self.redis = client  # the shared pool: short reads and the wake-ups
        # only the blocking XREAD, a cluster's client if the pool's is (not the environment's
        # say: the producer's Settings decided that)
        self._reader = connect(url, 1, name, blocks_ms=HUB_BLOCK_MS, cluster=is_cluster(client))
        self.wake_key = wake_key
        self._cursors: dict[str, str] = {}
        self._queues: dict[str, set[asyncio.Queue[Delivery]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="token-hub")

    async def stop(self) -> None:
        """Cancel the read loop. The flag ends it too where the Redis client swallows the
        cancellation of a blocked read (it then returns within one read)."""
        self._stopping = True
        await cancel_and_wait(self._task)
        await self._reader.aclose()

    @asynccontextmanager
    async def listen(self, key: str, after: str) -> AsyncIterator[asyncio.Queue[Delivery]]:
        """Every batch of entries the hub reads from `key` from now on (possibly some at or
        before `after`: the caller drops what it has already seen), or StreamUnreadable; BEHIND
        once the listener left LISTENER_BACKLOG batches untaken (they are dropped)."""
        if not is_stream_id(after):
            raise ValueError(f"not a stream entry id: {after[:48]!r}")
        queue: asyncio.Queue[Delivery] = asyncio.Queue(LISTENER_BACKLOG)
        self._queues[key].add(queue)
        try:
            if key not in self._cursors:
                start = await self._not_ahead(key, after)
                if key not in self._cursors:  # no other listener of it came meanwhile
                    self._cursors[key] = start
                    await self._wake()
            yield queue
        finally:
            self._queues[key].discard(queue)
            if not self._queues[key]:
                del self._queues[key]
                self._cursors.pop(key, None)

    async def _not_ahead(self, key: str, after: str) -> str:
        """Where the shared read of `key` starts: `after`, but never past the stream's last
        entry. A resume's Last-Event-ID is the client's to choose; one from the far future set
        the cursor every later listener of the job shares, and none got a live token until the
        job ended. One read, and only for a resume (a new stream starts at 0-0)."""
        if after == START:
            return after
        try:
            newest: Any = await self.redis.xrevrange(key, count=1)
        except ResponseError:  # no stream: the shared read finds out, and says so (_run)
            return after
        last = as_text(newest[0][0]) if newest else "0-0"
        return min(after, last, key=stream_id)

    async def _run(self) -> None:
        outage = RedisOutage("token hub")
        wake = await self._wake_cursor(outage)
        while not self._stopping:
            try:
                streams: dict[Any, Any] = {self.wake_key: wake, **self._cursors}
                reply: Any = await read_streams(self._reader, streams, READ_COUNT, HUB_BLOCK_MS)
            except RedisTimeoutError as exc:  # an idle connection's health check, a slow server
                log.debug("token hub read timed out (%r); retrying", exc)
                continue
            except RedisConnectionError as exc:
                await asyncio.sleep(outage.failed(exc))
                continue
            except ResponseError as exc:  # one stream's fault must not stall the others
                if not await self._drop_unreadable():
                    await asyncio.sleep(outage.failed(exc))
                continue
            except RedisError:  # never let one bad reply stop every stream of this producer
                log.exception("token hub read failed; retrying")
                await asyncio.sleep(0.5)
                continue
            outage.recovered()
            for raw_key, rows in reply or []:
                key, last = as_text(raw_key), as_text(rows[-1][0])
                if key == self.wake_key:
                    wake = last
                elif key in self._cursors:
                    self._cursors[key] = last
                    for queue in self._queues[key]:
                        _hand(queue, rows)

    async def _drop_unreadable(self) -> int:
        """Read each followed stream alone (not blocking) and stop following those Redis
        refuses as no stream; their listeners get StreamUnreadable, everyone else carries on.
        Returns how many were dropped: none when the refusal is the server's, not a key's."""
        dropped = 0
        for key, cursor in list(self._cursors.items()):
            try:
                await read_streams(self.redis, {key: cursor}, 1)
            except ResponseError as exc:
                if not str(exc).startswith(NO_STREAM):
                    return dropped
                log.warning("token hub dropped %s (%s)", key, exc)
                self._cursors.pop(key, None)
                dropped += 1
                for queue in self._queues.get(key, ()):
                    _hand(queue, StreamUnreadable(f"{key}: {exc}"))
            except RedisError:  # an outage meanwhile (it used to end the reader): waited out
                return dropped
        return dropped

    async def _wake_cursor(self, outage: RedisOutage) -> str:
        """The id after which wake-ups count: the hub's own first entry. Any refusal is waited
        out (a write refused at start, NOREPLICAS or OOM, used to end the reader for good)."""
        while True:
            try:
                return await self._wake()
            except RedisError as exc:
                await asyncio.sleep(outage.failed(exc))

    async def _wake(self) -> str:
        """Append to the wake stream (kept short, and gone a day after this producer is)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.wake_key, {"w": 1}, maxlen=WAKE_MAXLEN)
            pipe.expire(self.wake_key, WAKE_TTL_S)
            entry_id, _ = await pipe.execute()
        return as_text(entry_id)


def _hand(queue: asyncio.Queue[Delivery], delivery: Rows | StreamUnreadable) -> None:
    """Queue `delivery` for a listener, never blocking the hub (one reader serves every stream
    of the partition); a full queue is emptied for BEHIND, or for a refusal, its last word."""
    if queue.full():
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(delivery if isinstance(delivery, StreamUnreadable) else BEHIND)
    else:
        queue.put_nowait(delivery)


class TokenFollower:
    """Follows one job's token stream from where the client left off: what already exists is
    read directly, a page at a time, live entries come from the hub; as it opens, and whenever
    nothing came for `block_ms`, a look at the job hash ends a stream whose job ended without a
    final event (cancelled while queued, expired).

    A final ends the stream only as its last word. A worker appends it once FINISH wrote the
    job's result (a release before that one appended it first, and one that died in between
    left a final the hash never confirms, and a rerun's `restart`, text and final after it;
    one that dies between FINISH and its final now leaves none, and the hash's look ends the
    stream with a final made from the record). So a final that entries follow is dropped unsent, and
    one that ends what is read is held until a look at the hash finds the job over: one look
    as it comes, then (its worker still at FINISH, or dead) every FINISH_GRACE_S, doubling up
    to `block_ms`. The job's hash has the last word over a final it contradicts."""

    def __init__(self, hub: TokenHub, store: JobStore, keys: Keys, block_ms: int = 1000) -> None:
        self.hub = hub
        self.store = store
        self.keys = keys
        self.block_ms = block_ms

    async def follow(self, job_id: str, after: str = START) -> AsyncGenerator[TokenEvent, None]:
        """Every event after `after`, live ones as they come, ending with exactly one final."""
        key = self.keys.tokens(job_id)
        block_s = self.block_ms / 1000
        async with self.hub.listen(job_tag(job_id), key, after) as queue:
            events, over, record = await self._poll(job_id, key, after)
            if not over:  # a job over already ends at once, not after `block_ms`
                events = await self._read(key, after)
            held: TokenEvent | None = None  # a final not known yet to be the stream's last word
            fresh = False  # what was read ends with a final not looked into yet
            wait_s = block_s
            while True:
                for event in events:
                    if stream_id(event.id) <= stream_id(after):
                        continue  # the hub's read and ours overlap
                    after, held, fresh = event.id, event if event.final else None, event.final
                    if not event.final:
                        yield event
                if len(events) >= READ_COUNT:  # a full page: the next, once this one is sent
                    events = await self._read(key, after)
                    continue
                if over:
                    for event in await self._last_words(key, held, record, after):
                        yield event
                    return
                if fresh:
                    fresh = False
                    events, over, record = await self._poll(job_id, key, after)
                    wait_s = FINISH_GRACE_S
                    continue
                events, over, record = await self._next(
                    job_id, key, after, queue, wait_s if held else block_s
                )
                wait_s = min(2 * wait_s, block_s)

    async def _next(
        self, job_id: str, key: str, after: str, queue: asyncio.Queue[Delivery], wait_s: float
    ) -> tuple[list[TokenEvent], bool, JobRecord | None]:
        """(events, over, record): the next live entries (read from Redis again if the hub
        dropped some: BEHIND); or, after `wait_s` without any, what `_poll` finds."""
        try:
            delivery = await asyncio.wait_for(queue.get(), wait_s)
        except TimeoutError:
            return await self._poll(job_id, key, after)
        deliveries = [delivery]
        while not queue.empty():
            deliveries.append(queue.get_nowait())
        rows: Rows = []
        for item in deliveries:
            if isinstance(item, StreamUnreadable):
                raise item
            rows += item if isinstance(item, list) else []
        if any(item is BEHIND for item in deliveries):
            return await self._read(key, after), False, None
        return [TokenEvent.decode(eid, raw) for eid, raw in rows], False, None

    async def _poll(
        self, job_id: str, key: str, after: str
    ) -> tuple[list[TokenEvent], bool, JobRecord | None]:
        """A look at the job: nothing while it runs; once it is over (or gone), what is left of
        its stream, and its record."""
        record = await self.store.get(job_id)
        # Once the hash is terminal, what is left in the stream is readable without blocking:
        # the worker's final follows FINISH by a round trip, and without it `_last_word` makes
        # one from the record.
        if record is not None and not record.status.terminal:
            return [], False, None
        return await self._read(key, after), True, record

    async def _last_words(
        self, key: str, final: TokenEvent | None, record: JobRecord | None, after: str
    ) -> list[TokenEvent]:
        """How a stream read to its end once its job was over ends: with its own last final,
        unless the hash contradicts it (its run died before FINISH, and the job ended otherwise:
        dead-lettered, cancelled, expired) or there is none; then with the hash's (none if it is
        gone), whose id follows the stream's last entry. A stream gone (expired) under a reader
        past its start (`after`: read between pages, or resumed) left that reader's text cut
        short: the job's whole text comes again first (`retold`)."""
        if final is not None and confirms(record, final):
            return [final]
        if record is None:
            return []
        last = await self.hub.last(key)
        made = final_from_job(record, last.id if last else None)
        if last is None and after != START:
            return [*retold(record), made]
        return [made]

    async def _read(self, key: str, after: str) -> list[TokenEvent]:
        """The stream's next page after `after` now (READ_COUNT entries at most, no blocking);
        `follow` reads the next once this one is sent. Read whole, the rest of a long
        generation sat in memory for a client that opened late or read slowly."""
        reply = await self.hub.read(key, after, READ_COUNT)
        return [TokenEvent.decode(eid, raw) for _, rows in reply or [] for eid, raw in rows]
