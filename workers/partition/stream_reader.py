"""The one owner of a partition's consumer-group reads. An idle worker blocks in one
XREADGROUP on both lanes, which hands it the jobs directly: no claim round trip follows, since
an entry in this consumer's pending list is what running means to the stream, and FINISH's state
check refuses a result the job can no longer take (cancelled meanwhile). Under load one script
reads the preferred lane with each job's status in the same round trip, so cancelled jobs are
skipped. Also: marking jobs running (for runs long enough to be seen, and for generate models at
once), the XCLAIM that keeps long-running entries ours, and the recovery of a consumer group
that vanished (Redis restarted empty, or flushed).

The reads that hand entries over (XREADGROUP, TAKE, the claim back after an outage) are sent
once (`sent_once`): a lost connection reaches the loop, which backs off and claims back what a
read the server served had handed over (`held`). redis-py sent such a read again unseen, and the
first read's entries sat in the pending list until a reclaim, a visibility timeout later and one
delivery more."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import TryAgainError

from shared import job_scripts
from shared.codec import MOVED_FIELD, RequestEntry, as_text
from shared.consumer_groups import HAND_BACK, TOUCH, ensure_groups, recreating_groups
from shared.job_states import JobStatus
from shared.job_store import now_ms
from shared.keys import GROUP, Keys
from shared.rate_limit import RateLimiter
from shared.redis_client import call_script, read_streams, sent_once
from shared.settings import get_settings
from workers.partition.arrival_rate import ArrivalRate
from workers.partition.stopping import Stopping

log = logging.getLogger(__name__)
_MOVED = MOVED_FIELD.encode()


@dataclass(frozen=True, slots=True)
class Undecodable:
    """An entry that is no job but names one (`RequestEntry.named`), why it is none, and its
    payload as it came: its job fails saying so (`Partition.skip_or_expire`)."""

    entry: RequestEntry
    reason: str
    payload: bytes


@dataclass(slots=True)
class Delivery:
    """One entry handed to this consumer; `status` is the job's state when read: `queued` or
    `running` means run it, anything else means acknowledge and skip (a blocking read's entries
    are taken as `queued`). `attempts`: this entry's deliveries so far. `redelivered`: taken
    over from a consumer that abandoned it (a previous attempt may have streamed tokens).
    `moved`: a fair lane's round robin moved it in from the held jobs, so more may be held.
    `undecodable`: what an entry that is no job (`entry` None) says of the job it names."""

    entry_id: bytes
    entry: RequestEntry | None
    status: str
    claimed_ms: int
    redelivered: bool = False
    attempts: int = 1
    moved: bool = False
    undecodable: Undecodable | None = None

    @property
    def runnable(self) -> bool:
        return self.entry is not None and self.status in (JobStatus.QUEUED, JobStatus.RUNNING)


MicroBatch = tuple[str, list[Delivery]]  # (stream, deliveries read from it)
# An entry of one lane, (stream, entry id): the two lanes' streams number their entries alike.
LaneEntry = tuple[str, bytes]


class StreamReader:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        streams: Sequence[str],
        consumer: str,
        mark_on_read: bool = False,
    ) -> None:
        """`mark_on_read`: mark jobs running as they are read (generate models, whose jobs
        stream for seconds); otherwise only runs that last are marked (`mark_running`)."""
        self.redis = client
        self.keys = keys
        self.streams = tuple(streams)
        self.consumer = consumer
        self.mark_on_read = mark_on_read
        # the longest a read may block: the client's socket timeout allows no more (`connect`)
        self.max_block_ms = get_settings().block_ms
        self._take = client.register_script(job_scripts.TAKE)
        self._mark = client.register_script(job_scripts.MARK_RUNNING)
        self._touch = client.register_script(TOUCH)
        self._hand_back = client.register_script(HAND_BACK)

    async def ensure_groups(self) -> None:
        """Create the lanes' groups where missing (`shared/consumer_groups.py`)."""
        await ensure_groups(self.redis, self.streams)

    async def take(self, streams: Sequence[str], count: int) -> MicroBatch | None:
        """One non-blocking round trip: up to `count` new entries of the first of `streams`
        that has any (in the order the caller prefers), with their jobs' statuses."""
        now = now_ms()
        mark = "1" if self.mark_on_read else ""
        with sent_once():
            reply = await recreating_groups(
                self.redis,
                self.streams,
                lambda: self._take(
                    keys=list(streams),
                    args=[GROUP, self.consumer, count, self.keys.job_prefix, now, mark],
                ),
            )
        if not reply or not reply[0]:
            return None
        index, rows = reply
        return streams[index - 1], [decode_delivery(eid, f, status, now) for eid, f, status in rows]

    async def wait(
        self, streams: Sequence[str], count: int, block_ms: int | None
    ) -> list[MicroBatch]:
        """Block up to `block_ms` on all of `streams` at once (wakes on whichever fills first;
        returns at once when entries wait; None: do not block). The jobs are handed over as
        they are: no claim round trip (a generate loop's are marked running, one round trip)."""
        with sent_once():
            reply: Any = await recreating_groups(
                self.redis,
                self.streams,
                lambda: read_streams(
                    self.redis,
                    dict.fromkeys(streams, ">"),
                    count,
                    None if block_ms is None else max(block_ms, 1),
                    group=(GROUP, self.consumer),
                ),
            )
        now = now_ms()
        batches = [
            (as_text(stream), [_delivered(e, fields, now) for e, fields in rows])
            for stream, rows in reply or []
            if rows
        ]
        return await self._marked(batches)

    async def held(
        self, streams: Sequence[str], count: int, in_hand: Collection[LaneEntry]
    ) -> list[MicroBatch]:
        """Up to `count` entries of `streams` this consumer was handed and is not running (not
        `in_hand`): a read whose reply an outage lost leaves them in its pending list, where
        nobody would run them before reclaim, a visibility timeout later. The pending list is
        listed (XPENDING counts no delivery) and what is not in hand claimed again, its delivery
        count kept (XCLAIM's RETRYCOUNT: the lost read ran nothing; counted again, a cut read
        brought a job one delivery nearer its dead letter), two round trips after an outage.
        Reading the consumer's history (XREADGROUP id 0) instead counted a delivery of every
        entry it returned, those still running too, which a later crash would then dead-letter
        before their time. An entry delivered more than once before (a RECLAIM whose reply was
        lost took it over from a dead consumer) is handed over as redelivered, so a generation
        run again starts `restart`."""
        batches = await recreating_groups(
            self.redis, self.streams, lambda: self._claim_back(streams, count, in_hand)
        )
        return await self._marked(batches or [])

    async def _claim_back(
        self, streams: Sequence[str], count: int, in_hand: Collection[LaneEntry]
    ) -> list[MicroBatch]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xpending_range(
                    stream, GROUP, "-", "+", count + len(in_hand), consumername=self.consumer
                )
            listed = await pipe.execute()
        lost = [
            (stream, row)
            for stream, rows in zip(streams, listed, strict=True)
            for row in rows
            if (stream, row["message_id"]) not in in_hand
        ][:count]  # in all: a generate loop's free slots (the rest are claimed back next time)
        if not lost:
            return []
        # Each claimed only if idle at least as long as listed: one another worker reclaimed
        # meanwhile (its idle time reset) stays with it, not taken back and run twice.
        with sent_once():  # sent again, it claims nothing (the first reset their idle time)
            async with self.redis.pipeline(transaction=False) as pipe:
                for stream, row in lost:
                    idle_ms = row["time_since_delivered"]
                    pipe.xclaim(
                        stream,
                        GROUP,
                        self.consumer,
                        idle_ms,
                        [row["message_id"]],
                        retrycount=row["times_delivered"],
                    )
                claimed = await pipe.execute()
        now = now_ms()
        by_stream: dict[str, list[Delivery]] = {}
        for (stream, row), rows in zip(lost, claimed, strict=True):
            # deliveries before this claim back: this consumer's lost read counted one
            delivered = int(row["times_delivered"])
            for entry_id, fields in rows:  # none where another worker reclaimed it meanwhile
                by_stream.setdefault(stream, []).append(
                    _delivered(entry_id, fields, now, delivered)
                )
        return list(by_stream.items())

    async def _marked(self, batches: list[MicroBatch]) -> list[MicroBatch]:
        """Deliveries handed over as they are, a generate loop's marked running (one round
        trip). A mark refused because the jobs' slot is migrating (their hashes split between
        two masters) leaves them unmarked, taken as queued (as TAKE hands over a job whose hash
        moved ahead): raised, it left them in the pending list, and each retry claimed them back
        (`held`) until the slot had moved."""
        if self.mark_on_read:
            for _, deliveries in batches:
                try:
                    await self.mark_running(deliveries)
                except TryAgainError as exc:  # RedirectsExhausted, ScriptHeldBack too
                    log.info(
                        "%d jobs run unmarked while their slot moves: %r", len(deliveries), exc
                    )
        return batches

    async def gather(
        self,
        batch: MicroBatch,
        max_items: int,
        delay_ms: float,
        preferred: Sequence[int] = (),
        arrivals: ArrivalRate | None = None,
        stop: Stopping | None = None,
        in_hand: Collection[LaneEntry] = (),
    ) -> MicroBatch:
        """Top a non-empty batch up from its own stream until full or `delay_ms` has passed,
        while `arrivals` (when given) expects another job before then: a lone job on an idle
        partition is served at once. When the stream runs dry at one of the `preferred` sizes
        (a size that fills an engine's shape bucket, as Triton's `preferred_batch_size`), stop
        there instead of waiting. Each read blocks at most `CONVEYOR_BLOCK_MS`, a longer delay
        takes several: one read blocking for all of it (up to a minute) outlasted the socket
        timeout, and the micro-batch was lost to a timeout and claimed back a delivery more.
        `stop`, set, ends the top-up (its read cut as `Stopping.unless_set` cuts it): a micro-
        batch held open at a stop waited out the delay, reading jobs queued after the stop. What
        a cut read's lost reply handed over joins the batch, claimed back (`held`: entries of
        this consumer neither in the batch nor `in_hand`), to finish before it stops; only a cut
        read: with none cut, no reply was lost, and the XPENDING that listed them at every stop
        could find nothing it had handed over."""
        stream, deliveries = batch
        if not deliveries or delay_ms <= 0:
            return batch
        deadline = time.monotonic() + delay_ms / 1000.0
        while len(deliveries) < max_items and not (stop and stop.is_set()):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0.001 or (arrivals and not arrivals.expects_more(remaining_s)):
                break
            at_preferred = len(deliveries) in preferred
            started = time.monotonic()
            block_ms = None if at_preferred else min(int(remaining_s * 1000), self.max_block_ms)
            read = partial(self.wait, [stream], max_items - len(deliveries), block_ms)
            waited = await (read() if stop is None else stop.unless_set(read))
            more = [d for _, got in waited or [] for d in got]
            if arrivals is not None:
                arrivals.waited(time.monotonic() - started, len(more))
                arrivals.arrived(len(more))
            deliveries.extend(more)
            if waited is None:  # cut: its lost reply may have handed over what the batch lacks
                await self._claimed_back_into(batch, max_items, in_hand)
                break
            if not more and at_preferred:
                break
        return batch

    async def _claimed_back_into(
        self, batch: MicroBatch, max_items: int, in_hand: Collection[LaneEntry]
    ) -> None:
        """`batch` filled up with its lane's entries this consumer holds that neither it nor
        `in_hand` has: those a cut top-up read handed over (at most what the batch lacked,
        its COUNT), listed behind the running ones (`held` lists as many more as those)."""
        stream, deliveries = batch
        ours = {*in_hand, *((stream, d.entry_id) for d in deliveries)}
        for _, lost in await self.held([stream], max_items - len(deliveries), ours):
            deliveries.extend(lost)

    async def mark_running(self, deliveries: Sequence[Delivery]) -> None:
        """Mark jobs running (those still queued or running), one round trip for all; each
        delivery's status becomes its job's after the mark (a cancelled one's: cancelled)."""
        marked = [d for d in deliveries if d.entry is not None]
        keys: list[str] = []
        args: list[str | int] = [self.consumer]
        for d in marked:
            assert d.entry is not None
            keys.append(self.keys.job(d.entry.job_id))
            args += [d.claimed_ms, d.attempts]
        if marked:
            statuses = await call_script(self._mark, keys, args)
            for delivery, status in zip(marked, statuses, strict=True):
                delivery.status = as_text(status)

    async def touch(self, stream: str, entry_ids: Sequence[bytes | str]) -> list[str]:
        """Reset the idle time of entries this consumer is still running, so no reclaimer
        mistakes them for abandoned ones (`consumer_groups.TOUCH`); returns those it no longer
        owns, whose jobs another worker runs or ran: give them up."""
        lost = await recreating_groups(
            self.redis,
            self.streams,
            lambda: call_script(self._touch, [stream], [GROUP, self.consumer, *entry_ids]),
        )
        return [as_text(entry_id) for entry_id in lost or []]

    async def hand_back(self, stream: str, entry_ids: Sequence[bytes], idle_ms: int) -> int:
        """Give up entries this consumer will not finish (a drain's), at once and uncounted
        (`consumer_groups.HAND_BACK`): they are due to the next reclaim; returns how many. A
        lane deleted meanwhile took them along (none handed back): its NOGROUP ended the drain
        on an error. The call's reply is kept a while, for a resend of it to answer."""
        reply = f"{stream}:call:{uuid.uuid4().hex[:16]}"  # the stream's slot
        head = [GROUP, self.consumer, idle_ms, RateLimiter.RERUN_MS]
        handed = await recreating_groups(
            self.redis,
            self.streams,
            lambda: call_script(self._hand_back, [stream, reply], [*head, *entry_ids]),
        )
        return int(handed or 0)


def decode_delivery(
    entry_id: bytes,
    flat: list[bytes],
    status: bytes,
    now: int,
    redelivered: bool = False,
    attempts: int = 1,
) -> Delivery:
    """A Lua script's `{id, fields, status}` row as a Delivery (undecodable: entry None)."""
    entry, undecodable = _entry(entry_id, flat, now)
    moved = flat is not None and _MOVED in flat[::2]
    status_text = as_text(status)
    return Delivery(entry_id, entry, status_text, now, redelivered, attempts, moved, undecodable)


def _delivered(
    entry_id: bytes, fields: dict[bytes, bytes] | None, now: int, deliveries: int = 1
) -> Delivery:
    """An entry a plain XREADGROUP (or XCLAIM) delivered: its job is taken as queued. One with
    `deliveries` before is a redelivery: a previous run may have streamed tokens."""
    moved = fields is not None and _MOVED in fields
    entry, undecodable = _entry(entry_id, fields, now)
    status = JobStatus.QUEUED.value
    redelivered = deliveries > 1
    return Delivery(entry_id, entry, status, now, redelivered, deliveries, moved, undecodable)


def _entry(
    entry_id: bytes, fields: list[bytes] | dict[bytes, bytes] | None, now: int
) -> tuple[RequestEntry | None, Undecodable | None]:
    """The entry's job, or (None, what it says of the job it names, if any)."""
    if fields is None:  # deleted while pending: a read of the pending list gives no fields
        log.error("entry %r pending but deleted from its stream; acknowledging it", entry_id)
        return None, None
    try:
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        return RequestEntry.decode(fields), None
    except (KeyError, ValueError) as exc:
        log.error("undecodable entry %r on stream (%s); acknowledging it", entry_id, exc)
        if not isinstance(fields, dict) or (named := RequestEntry.named(fields, now)) is None:
            return None, None
        return None, Undecodable(named, _why(exc), fields.get(b"payload", b""))


def _why(exc: KeyError | ValueError) -> str:
    """Why an entry is no job, for its job's error."""
    if isinstance(exc, KeyError):
        return f"it has no {as_text(exc.args[0])} field"
    return str(exc)
