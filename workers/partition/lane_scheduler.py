"""What a partition loop runs next: abandoned entries whose reclaim is due first (one at a time,
each followed by a turn for new work), then two lanes — online requests first, the bulk lane
(Batch API jobs) a share of micro-batches while both have work (`bulk_share`), and all of them
while online is idle — so a large Batch API job drains at full speed alone and interactive jobs
still go first when they arrive."""

from __future__ import annotations

import time
from collections.abc import Collection
from functools import partial

from workers.partition.arrival_rate import ArrivalRate
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.reclaim_turn import ReclaimTurn
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import Delivery, LaneEntry, MicroBatch, StreamReader

# How long a micro-batch loop's read blocks while a reclaimed entry is still in a staged engine's
# pipeline: the next is claimed once it is written back, not a whole idle read (a second) later.
# Not a generate loop's: its reclaimed entry runs for seconds, a poll every 50 ms all through it
# would cost two round trips each; its next is claimed on the first read after it ends.
REDELIVERED_WAIT_MS = 50


class LaneCredit:
    """The bulk lane's claim on the next micro-batch: each online batch served while bulk waits
    adds `bulk_share`; at 1.0 it is bulk's turn, which spends one, the rest carried over (capped
    at 1.0, 0.7 would give bulk one batch per two online ones, not 0.7). An empty bulk lane on its
    turn forfeits the credit, so it cannot bank turns while it has nothing to run: it stays below
    2.0, one turn and a share."""

    def __init__(self, bulk_share: float) -> None:
        self.bulk_share = bulk_share
        self.credit = 0.0

    def bulk_turn(self) -> bool:
        # tolerant: ten additions of 0.1 sum to 0.9999999999999999, which must count as a turn
        return self.credit >= 1.0 - 1e-9

    def served(self, bulk: bool) -> None:
        """Account for a micro-batch just taken from the bulk lane (`bulk`) or the online one,
        on the turn `bulk_turn()` gave before the take."""
        bulk_turn = self.bulk_turn()
        if not bulk:
            self.credit = 0.0 if bulk_turn else self.credit + self.bulk_share
        elif bulk_turn:
            self.credit -= 1.0


class LaneScheduler:
    def __init__(
        self,
        partition: Partition,
        reader: StreamReader,
        reclaimer: Reclaimer,
        turn: ReclaimTurn | None = None,
    ) -> None:
        """`turn`: the one the worker's other partitions share (none: this partition alone)."""
        self.reader = reader
        self.reclaimer = reclaimer
        self.turn = turn or ReclaimTurn()
        self.online = partition.online
        self.bulk = partition.bulk
        self.credit = LaneCredit(partition.config.bulk_share)
        self.preferred = partition.config.preferred_batch_sizes_of(partition.variant)
        # per lane: a bulk drain's rate made a lone online job wait for arrivals that never came
        self.arrivals = {self.online: ArrivalRate(), self.bulk: ArrivalRate()}
        self.backlog = False  # the last read filled a micro-batch: more is likely waiting
        # Undelivered entries a fair lane's stream holds before jobs are held (0: not fair).
        self.fair_window = partition.config.fair_window_of(partition.variant)
        self.after_outage = False  # a read's reply may have been lost: look in our pending list
        self.new_turn = False  # a reclaimed entry was handed over last: new work goes next
        self.redelivered: set[LaneEntry] = set()  # the reclaimed entry handed over last

    def outage(self) -> None:
        """Redis failed a call: if it was a read that Redis served but whose reply was lost,
        its entries are in this consumer's pending list, run by nobody. The next batches are
        those (`StreamReader.held`), until none is left."""
        self.after_outage = True

    async def next_batch(
        self,
        max_items: int,
        delay_ms: float,
        block_ms: int,
        in_hand: Collection[LaneEntry] = frozenset(),
        slots: bool = False,
        stop: Stopping | None = None,
    ) -> list[MicroBatch]:
        """One micro-batch (rarely two, when a blocking read returns from both lanes): after
        an outage, this consumer's pending entries that are not `in_hand` (running); then
        reclaimed entries as they come (`_reclaimed`), each followed by what waits new, read
        without blocking (none: `[]`, and the next call reclaims again); after a full
        micro-batch (a backlog) one script reads the lane preferred now, else the other;
        otherwise (idle, or keeping up) one blocking XREADGROUP on both lanes, which returns at
        once when entries wait and hands them over with no further round trip (with `slots`,
        after the script found neither lane had any: a round trip more per admission of a
        generate loop, whose jobs run for seconds). Then the micro-batch is topped up while
        more are coming.
        `slots`: `max_items` are free engine slots (a generate loop), not a micro-batch's
        size, and no more may be handed over in all: a script reads first, which finds what
        waits in either lane, and the blocking read only if neither has any (`_blocking_read`:
        jobs may reach both before it).
        `stop`: the loop's; set, it ends the blocking read at once (`Stopping.unless_set`), and
        what that read's lost reply may have handed over (up to its COUNT of each lane) is
        claimed back as after an outage."""
        if self.after_outage:
            if held := await self.reader.held([self.online, self.bulk], max_items, in_hand):
                return held
            self.after_outage = False
        top_up = partial(self._topped_up, max_items, delay_ms, in_hand, stop)
        if self.new_turn:  # between reclaimed entries, what waits new (without blocking)
            self.new_turn = False
            return [await top_up(batch)] if (batch := await self._take(max_items)) else []
        if reclaimed := await self._reclaimed(in_hand):
            self.new_turn = True
            return [reclaimed]
        if (self.backlog or slots) and (batch := await self._take(max_items)):
            return [await top_up(batch)]
        if not slots and self.redelivered.intersection(in_hand):  # staged: claim on soon
            block_ms = min(block_ms, REDELIVERED_WAIT_MS)
        lanes, count = self._blocking_read(max_items, slots)
        read = partial(self.reader.wait, lanes, count, block_ms)
        waited = await (read() if stop is None else stop.unless_set(read))
        if waited is None:  # cut: its lost reply may have handed over `count` of each lane
            return [
                batch for lane in lanes for batch in await self.reader.held([lane], count, in_hand)
            ]
        self.backlog = self._backlogged(waited, count)
        read_at = time.monotonic()
        return [await top_up(b, read_at) for b in waited]

    def _blocking_read(self, max_items: int, slots: bool) -> tuple[list[str], int]:
        """The lanes the blocking read waits on, and its COUNT, which Redis applies to each
        lane: with `slots`, half the free slots, so both lanes together hand over no more than
        those (one free slot: the online lane alone, and a bulk job is found by the next
        call's script, one block later at most). A read of both lanes with COUNT `max_items`
        handed over up to twice the free slots when jobs reached both after the script's
        read."""
        if not slots:
            return [self.online, self.bulk], max_items
        if max_items > 1:
            return [self.online, self.bulk], max_items // 2
        return [self.online], max_items

    async def _reclaimed(self, in_hand: Collection[LaneEntry]) -> MicroBatch | None:
        """An abandoned entry whose reclaim is due, one at a time, each claimed once the one
        before is written back (no longer `in_hand`): a crashed worker's micro-batch, or a
        generate loop's running jobs, may hold an input that kills the engine or the process,
        which, run with the others again, would take them all past `max_deliveries`; alone,
        it dies alone. A generate loop's new work fills its other slots meanwhile, and the
        reclaim pass's housekeeping goes on (`Reclaimer.housekeep`). One at a time across the
        worker's partitions too (`ReclaimTurn`): another's reclaimed entry in flight holds
        this partition's reclaims back, not its new work."""
        if self.redelivered.intersection(in_hand) or not self._turn_taken():
            await self.reclaimer.housekeep()
            return None
        reclaimed = await self.reclaimer.due(1, in_hand)
        self.redelivered = (
            {(reclaimed[0], d.entry_id) for d in reclaimed[1]} if reclaimed else set()
        )
        if not reclaimed:
            self.turn.release(self)
        return reclaimed

    def _turn_taken(self) -> bool:
        """Whether this partition holds the worker's reclaim turn now: the one it held (its
        last reclaimed entry is written back) is given up first, so another's may come next."""
        self.turn.release(self)
        return self.turn.take(self)

    async def _take(self, max_items: int) -> MicroBatch | None:
        """One script's read of the lane preferred now, else the other (None: both empty)."""
        order = [self.bulk, self.online] if self.credit.bulk_turn() else [self.online, self.bulk]
        if (batch := await self.reader.take(order, max_items)) is None:
            return None
        self.credit.served(bulk=batch[0] == self.bulk)
        self.backlog = len(batch[1]) >= max_items
        return batch

    def _backlogged(self, waited: list[MicroBatch], count: int) -> bool:
        """Whether a blocking read (COUNT `count` a lane) likely left jobs waiting, so the next
        read is a TAKE of the lane preferred now. A micro-batch of one is full whether or not
        more wait: after each lone job, a TAKE found nothing before the blocking read, two read
        round trips a job on an idle partition. There only both lanes' jobs in one read say so
        (only TAKE serves them by `bulk_share`); under one lane's backlog, the blocking read
        returns at once, one round trip a job as TAKE's."""
        if count == 1 and len(waited) > 1:
            return True
        return any(self._left_waiting(deliveries, count) for _, deliveries in waited)

    def _left_waiting(self, deliveries: list[Delivery], max_items: int) -> bool:
        """Whether a blocking read that handed over `deliveries` likely left jobs waiting: it
        filled a micro-batch of more than one, or jobs may be held (only a TAKE moves a micro-
        batch's worth of them in; the stream keeps just one to wake a worker): round robin had
        moved one of its jobs in (in any lane: a producer with `queue.fair` on holds jobs
        whatever this worker's config says), or, in a fair lane, the read took the stream's
        whole window (later jobs were held). A quiet fair lane is read as any other, one round
        trip per micro-batch."""
        if len(deliveries) >= max_items > 1 or any(d.moved for d in deliveries):
            return True
        return bool(self.fair_window) and len(deliveries) >= self.fair_window

    async def _topped_up(
        self,
        max_items: int,
        delay_ms: float,
        in_hand: Collection[LaneEntry],
        stop: Stopping | None,
        batch: MicroBatch,
        read_at: float | None = None,
    ) -> MicroBatch:
        """`batch` topped up while more are coming (`StreamReader.gather`), until `stop`: then
        what a top-up read it cut had handed over (its reply lost) joins it, claimed back as
        after a cut blocking read, to finish before it stops (none not `in_hand`: running).
        Whether more are coming is the rate before `batch`: its own jobs count only once it is
        topped up (counted first, a lone job on an idle partition made a rate that expected
        another, and waited for it). `read_at` (time.monotonic()): when the blocking read that
        handed `batch` over returned; the micro-batches of both lanes it hands over share one
        `delay_ms` from then, since the first runs only once the second is topped up too (each
        had its own: online jobs waited twice `max_queue_delay_ms`, on bulk arrivals)."""
        if read_at is not None:
            delay_ms -= (time.monotonic() - read_at) * 1000.0
        stream, deliveries = batch
        arrivals, read = self.arrivals[stream], len(deliveries)
        reader, preferred = self.reader, self.preferred
        await reader.gather(batch, max_items, delay_ms, preferred, arrivals, stop, in_hand)
        arrivals.arrived(read)
        return batch
