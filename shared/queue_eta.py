"""Queue position and ETA of queued jobs, and the admission limit a deadline sets. Positions are
read per request (one O(1) script); each partition's drain rate and live workers are refreshed
once a second for the whole producer, so an estimate costs no Redis call of its own.

Method (docs/architecture.md): the partition's throughput over the last RATE_WINDOW_S seconds,
scaled by live workers now over the mean live workers then, is what drains a lane; a lane
shares it with the other lane when both have work (online 1/(1+bulk_share), bulk
bulk_share/(1+bulk_share), as workers alternate). ETA = entries ahead / lane rate: when the job
should start running. A window's rate is the workers' capacity only while a lane had work
waiting (else it is the arrival rate); so is what finished over a busy spell (the looks since
work began to wait) over the spell's own time, which a window partly idle divides over seconds
the workers had nothing to do. That capacity per worker is kept through a pause or a light
load, so a burst after one gets ETAs at the speed the workers drain it. While waiting work goes
unfinished past one micro-batch's time (a worker beats with its engine stuck), that time is a
floor under the ETA, and a deadline it passes is refused: the capacity kept says nothing then."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import redis.asyncio as aioredis

from shared.dead_letters import Admission
from shared.drain_rate import LaneBacklog, drain_rates_and_waiting
from shared.job_store import JobRecord
from shared.model_repository import ModelConfig, ModelRepository
from shared.queue_position import (
    RATE_WINDOW_S,
    AbandonedEntries,
    PartitionLoad,
    QueuePositions,
    read_partition_loads,
)

REFRESH_S = 1.0
Partition = tuple[str, str]
# What a partition not read yet counts as: nothing waiting, nothing in flight.
NO_BACKLOG = LaneBacklog([0.0, 0.0], [0, 0], 0)
# Shortest busy spell whose rate is taken: a burst that came just before a look has had a
# couple of its jobs finished at most, too few to time the workers by.
MIN_SPELL_S = 0.4


@dataclass(frozen=True, slots=True)
class BusySpell:
    """Since when (Unix s) a partition's work has waited, at each of `looks` since, and how
    many entries finished meanwhile: finished / elapsed is how fast its workers go while busy.
    `after_idle`: begun after a look that saw none waiting, so that `since_s` is when work
    began to wait (else it may have waited longer: a first look, one whose clock went back, one
    that saw work waiting with no worker serving)."""

    since_s: float
    finished: int
    looks: int = 1
    after_idle: bool = False

    @classmethod
    def begun(cls, now: LaneBacklog, earlier: LaneBacklog | None) -> BusySpell:
        """Work waits now and did not at the last look: it began no earlier than that look nor
        than the oldest entry there now arrived, so what finished since the look is timed
        from the later (a light load's jobs before the burst count, its idle time does not)."""
        if earlier is None:
            return cls(now.read_s, 0)
        since = max(earlier.read_s, now.read_s - now.oldest_s)
        return cls(since, now.finished_since(earlier), after_idle=not any(earlier.waiting))

    def went_on(self, now: LaneBacklog, earlier: LaneBacklog) -> BusySpell:
        finished = self.finished + now.finished_since(earlier)
        return BusySpell(self.since_s, finished, self.looks + 1, self.after_idle)

    def covers(self, now: LaneBacklog) -> bool:
        """Whether work waited over the whole of `now`'s rate window: five looks a second apart
        reach four seconds back, the window up to six, and a window begun idle before a burst
        set the capacity down by that idle second's share (a sixth, for one look a burst)."""
        return not self.after_idle or self.since_s <= now.window_from_s

    def timed(self, now: LaneBacklog) -> bool:
        """Whether the spell has gone on long enough to time the workers by."""
        return now.read_s - self.since_s >= MIN_SPELL_S

    def rate(self, now: LaneBacklog) -> float:
        """Entries per second while busy (0: too short a spell to say)."""
        return self.finished / (now.read_s - self.since_s) if self.timed(now) else 0.0


@dataclass(frozen=True, slots=True)
class StartBy:
    """The latest a job may start and still run (Unix ms): its deadline, or sooner the end of
    the wait its queue allows (`max_queue_time_s`: a worker expires the job past it), a limit
    that moves with a retry as a `ttl_s` deadline does. `deadline`: the job has one of its own.
    `since_ms`: the job's enqueue stamp, from which its ETA and its lateness are counted (read
    on a later clock, a deadline exactly at the ETA shown came out a fraction of a ms short)."""

    ms: int
    queue_time: bool
    deadline: bool
    since_ms: float

    @classmethod
    def of(cls, config: ModelConfig, enqueued_ms: float, deadline_ms: int) -> StartBy:
        waited_out = math.floor(enqueued_ms + config.queue.max_queue_time_s * 1000)
        own = bool(deadline_ms)
        if own and deadline_ms <= waited_out:
            return cls(deadline_ms, queue_time=False, deadline=own, since_ms=enqueued_ms)
        return cls(waited_out, queue_time=True, deadline=own, since_ms=enqueued_ms)

    @property
    def budget_ms(self) -> int:
        """How long the job may wait to start, in the whole ms its limit and ETA are in."""
        return max(0, self.ms - math.floor(self.since_ms))

    @property
    def what(self) -> str:
        return "the queue's max_queue_time_s" if self.queue_time else "its deadline"


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a queued job stands: entries ahead in its lane and the ETA of its start (None
    while no rate is known, e.g. no worker serves the partition)."""

    queue_position: int
    eta_ms: int | None

    def public(self) -> dict[str, int | None]:
        return {"queue_position": self.queue_position, "eta_ms": self.eta_ms}


# What a queued job's view and 202 add (`Standing.public()`'s keys).
STANDING_FIELDS = tuple(field.name for field in dataclass_fields(Standing))

# Longest ETA given (2^53 ms: every JSON reader holds it exactly, JavaScript's too); past it,
# as behind a vanishing `bulk_share`, the ETA is unknown: orjson refuses integers past 64 bits
# and `round` an infinite float, either a 500 for every view of the job.
MAX_ETA_MS = 2**53


def eta_ms(position: int, rate: float) -> int | None:
    """Milliseconds until the entry `position` entries back starts, draining at `rate` a
    second (> 0); None past MAX_ETA_MS."""
    ms = position / rate * 1000
    return round(ms) if ms <= MAX_ETA_MS else None


def most_ahead(rate: float, budget_ms: int) -> int:
    """The most entries that may wait ahead of a job whose ETA (as `eta_ms` shows it) must be
    within `budget_ms`: one more than the arithmetic bound, then back while its ETA is over,
    as a float's error puts the bound a step either side."""
    ahead = math.floor((budget_ms + 0.5) * rate / 1000) + 1
    while ahead > 0 and ((eta := eta_ms(ahead, rate)) is None or eta > budget_ms):
        ahead -= 1
    return ahead


class QueueEta:
    def __init__(
        self, client: aioredis.Redis, positions: QueuePositions, repository: ModelRepository
    ) -> None:
        """`client` refreshes the loads; `positions` reads on the request path (group commit)."""
        self.client = client
        self.keys = positions.keys
        self.repository = repository
        self.positions = positions
        self.loads: dict[Partition, PartitionLoad] = {}
        self._serving: dict[Partition, deque[int]] = {}
        self._backlogged: dict[Partition, deque[bool]] = {}
        self._backlogs: dict[Partition, LaneBacklog] = {}  # at the last refresh
        self._capacity: dict[Partition, float] = {}  # entries/s per serving worker, both lanes
        self._spells: dict[Partition, BusySpell] = {}  # partitions whose work waits now
        self._stalls: dict[Partition, int] = {}  # ms past one micro-batch with none finished
        self._abandoned: dict[str, int] = {}  # a dead worker's entries per lane
        self._dead_entries = AbandonedEntries(client, self.keys)

    async def refresh(self) -> None:
        """Every partition's load and its lanes' backlog: the lanes' drained counters, jobs
        waiting (undelivered, or held back by a fair lane) and entries in flight in one round
        trip, then the worker registry's two, and up to three more only while a consumer with
        no heartbeat holds entries (its lanes' own counts of them, less those of ended jobs).
        A partition with a key of another type is left out (no load: its jobs' ETAs unknown),
        not every partition's refresh failed with it."""
        partitions = [(c.name, v) for c in self.repository for v in c.variants]
        lanes = [(self.keys.queue(*p), self.keys.bulk_queue(*p)) for p in partitions]
        backlogs = await drain_rates_and_waiting(self.client, self.keys, lanes, RATE_WINDOW_S)
        read = {p: b for p, b in zip(partitions, backlogs, strict=True) if b is not None}
        rates = [backlog.rates for backlog in read.values()]
        self.loads = await read_partition_loads(self.client, self.keys, list(read), rates)
        earlier, self._backlogs = self._backlogs, read
        for partition, load in self.loads.items():
            self._remember(partition, load, earlier.get(partition))
        self._abandoned = await self._dead_entries.read(self._held_by_the_dead())
        # read by every submit's standing: worked out here, once a refresh, not per request
        self._stalls = {
            (c.name, v): stall
            for c in self.repository
            for v in c.variants
            if (stall := self._stall_ms(c, v)) > 0
        }

    def _held_by_the_dead(self) -> dict[str, frozenset[str]]:
        """The lanes of the partitions where a consumer with no heartbeat holds entries, each
        with its live workers: the backlog's holders are both lanes' summed, and only these
        lanes need counting apart (none, the usual case: no round trip)."""
        lanes = {}
        for (model, variant), load in self.loads.items():
            if set(self._backlog((model, variant)).holders) - load.workers:
                lanes[self.keys.queue(model, variant)] = load.workers
                lanes[self.keys.bulk_queue(model, variant)] = load.workers
        return lanes

    def _remember(
        self, partition: Partition, load: PartitionLoad, earlier: LaneBacklog | None
    ) -> None:
        """Keep the workers' capacity per worker, measured only while work waited: a lane
        drained dry finishes what arrives, which says nothing of how fast the workers go (a
        pause, a light load), nor do a light load's jobs a look catches before a worker
        reads them (measured so, its arrival rate refused most of the next burst). A window
        busy throughout gives the capacity, up or down; one partly idle, or a busy spell, only
        a floor under it. Forgotten once no worker serves (the next ones may differ)."""
        samples = self._serving.setdefault(partition, deque(maxlen=RATE_WINDOW_S))
        samples.append(load.serving)
        backlogged = self._backlogged.setdefault(partition, deque(maxlen=RATE_WINDOW_S))
        now = self._backlog(partition)
        backlogged.append(sum(now.waiting) > 0)
        if load.serving == 0 or not backlogged[-1]:
            self._spells.pop(partition, None)
            if load.serving == 0:
                self._capacity.pop(partition, None)
            return
        spell = self._spell(partition, earlier)
        if spell.looks == 1 and sum(now.waiting) <= load.serving:
            return  # as many as idle workers take at once, caught before they read them
        if spell.looks == 1 and earlier is not None and not spell.timed(now):
            return  # begun just now, after a look that saw none waiting: the window is idle's
        # a window with a look that saw no worker serving (a scale-up from zero) is not the
        # workers' capacity: read so, it was set a few times too low for the window's length
        busy = len(backlogged) == RATE_WINDOW_S and all(backlogged) and all(samples)
        busy_throughout = busy and spell.covers(now)
        rate = self._busy_rate(partition, load, spell, busy_throughout)
        floor = 0.0 if busy_throughout else self._capacity.get(partition, 0.0)
        if max(rate, floor) > 0:
            self._capacity[partition] = max(rate, floor)

    def _busy_rate(
        self,
        partition: Partition,
        load: PartitionLoad,
        spell: BusySpell,
        busy_throughout: bool,
    ) -> float:
        """Entries per second per worker the partition drained while its work waited: the
        window's when busy throughout (a long spell's rate lags a change), else the more of it
        and the busy spell's. A window partly idle divides over seconds the workers had nothing
        to do: after a light load, 11 of a burst of 20 jobs were refused by it, each of which
        the worker started within its deadline. The window's rate is its workers' (their mean
        over its looks), the spell's those now: over the window's mean, a spell begun as the
        partition scaled up from zero read as several times the workers' speed."""
        window = (load.online_per_s + load.bulk_per_s) / self._mean_serving(partition, load)
        if busy_throughout:
            return window
        return max(window, spell.rate(self._backlog(partition)) / load.serving)

    def _spell(self, partition: Partition, earlier: LaneBacklog | None) -> BusySpell:
        """The partition's busy spell, begun or gone on by this look (work waits now); begun
        anew at a look whose clock is behind the last one's (NTP stepped it back), with nothing
        finished, so that the look measures nothing: its window read seconds that had ended
        before the last look as finished since, and a spell begun in what became the future was
        timed from there (hundreds of entries over half a second read as the workers' capacity
        once the clock came back)."""
        now, spell = self._backlog(partition), self._spells.get(partition)
        if earlier is not None and now.read_s < earlier.read_s:
            earlier = None
        if spell is None or earlier is None:
            spell = BusySpell.begun(now, earlier)
        else:
            spell = spell.went_on(now, earlier)
        self._spells[partition] = spell
        return spell

    def load(self, model: str, variant: str) -> PartitionLoad | None:
        """The partition's load at the last refresh (None: not seen yet)."""
        return self.loads.get((model, variant))

    def lane_rate(self, config: ModelConfig, variant: str, bulk: bool) -> float:
        """Entries per second the lane should drain at now (0: unknown): the workers' capacity
        when measured, else (or if more) the window's rate, both scaled to the workers now.
        While the other lane has work waiting the lane gets its share of micro-batches; while
        it has none but drained some in the window (a trickle), what that left, its share at
        least: the scheduler alternates only while both lanes wait, and a bulk backlog beside
        an online job a second was given its 0.2 share, ETAs six times too long."""
        partition = (config.name, variant)
        load = self.loads.get(partition, PartitionLoad())
        total = self._partition_rate(partition)
        if total <= 0:
            return 0.0
        other_waiting = self._backlog(partition).waiting[0 if bulk else 1]
        other_per_s = load.online_per_s if bulk else load.bulk_per_s
        if other_per_s == 0 and other_waiting == 0:
            return total
        share = total * (config.bulk_share if bulk else 1.0) / (1 + config.bulk_share)
        return share if other_waiting > 0 else max(share, total - other_per_s)

    def _partition_rate(self, partition: Partition) -> float:
        """Entries per second both lanes should drain at with the workers now (0: unknown)."""
        load = self.loads.get(partition, PartitionLoad())
        mean_serving = self._mean_serving(partition, load)
        if load.serving == 0 or mean_serving == 0:
            return 0.0
        window = (load.online_per_s + load.bulk_per_s) / mean_serving
        return max(window, self._capacity.get(partition, 0.0)) * load.serving

    def _mean_serving(self, partition: Partition, load: PartitionLoad) -> float:
        """Workers serving the partition over the rate window's looks, on average: its drained
        counts are theirs (`load`'s alone before a look was kept)."""
        samples = self._serving.get(partition) or deque([load.serving])
        return sum(samples) / len(samples)

    def _stall_ms(self, config: ModelConfig, variant: str) -> int:
        """How long the partition's waiting work has gone unfinished past one micro-batch's
        time at its rate (a healthy worker's drains are that far apart): the floor under its
        ETAs. A worker that beats with its engine stuck keeps the capacity measured before the
        stall, so ETAs promised the old rate and deadline admission took jobs it could not
        start in time, for as long as the stall went on."""
        partition = (config.name, variant)
        total = self._partition_rate(partition)
        if total <= 0:
            return 0
        serving = self.loads[partition].serving
        batch_s = config.max_batch_size_of(variant) * serving / total
        return max(0, round((self._backlog(partition).stalled_s - batch_s) * 1000))

    def standing(self, config: ModelConfig, variant: str, bulk: bool, position: int) -> Standing:
        """Where a job stands behind `position` entries undelivered ahead of it and a dead
        worker's entries in its lane at the last refresh: reclaimed, those run before it (read
        as neither ahead nor running, a job behind them was told it stood that many nearer).
        Undelivered none, it starts at once all the same while a live worker is idle."""
        ahead = position + self._abandoned_in(config, variant, bulk)
        rate = self.lane_rate(config, variant, bulk)
        eta: int | None = None
        if rate > 0:
            eta = eta_ms(ahead, rate)
            stall = self._stalls.get((config.name, variant), 0)
            eta = None if eta is None else max(eta, stall)
        elif position == 0 and self._starts_at_once(config, variant, bulk):
            eta = 0
        return Standing(ahead, eta)

    def _starts_at_once(self, config: ModelConfig, variant: str, bulk: bool) -> bool:
        """Whether a job at the head of a lane with no rate known starts now: a worker serves
        and has nothing in hand (one busy past the rate window on long jobs, a generate
        model's slots full, showed `eta_ms: 0` for as long as they ran; a dead worker's entries,
        pending until reclaimed, are in no live worker's hand), and, for a bulk lane with no
        share of the reads, no online work waits ahead of it."""
        partition = (config.name, variant)
        backlog, load = self._backlog(partition), self.loads.get(partition, PartitionLoad())
        if not load.serving or backlog.in_flight_at(load.workers):
            return False
        return not (bulk and config.bulk_share == 0 and backlog.waiting[0] > 0)

    def _backlog(self, partition: Partition) -> LaneBacklog:
        return self._backlogs.get(partition, NO_BACKLOG)

    def max_ahead(self, config: ModelConfig, variant: str, bulk: bool, start_by: StartBy) -> int:
        """Most entries that may wait undelivered ahead of a job for it to start by `start_by`,
        when the model admits by deadline and the workers' capacity is known; else -1 (no
        limit). A light load's rate is its arrivals, far below what a worker could start:
        weighed by it, a burst's jobs with a deadline a few seconds off were refused (14 of 20
        at 1 job/s before, each of them started within 2 s)."""
        rate = self._admitting_rate(config, variant, bulk)
        if rate <= 0:
            return -1
        room = self._room(config, variant, bulk, start_by, rate)
        return 0 if room is None else room  # None: late with none ahead (`stalled_ahead`)

    def stalled_ahead(
        self, config: ModelConfig, variant: str, bulk: bool, start_by: StartBy
    ) -> int | None:
        """The entries waiting in the job's lane at the last refresh when the partition's stall,
        or a dead worker's entries in the lane, alone make it start after `start_by`, else
        None: it is refused before ENQUEUE, whose bound counts the entries ahead and so let in
        a job on an empty lane of a stalled partition (its 202 showed the stall's ETA past its
        deadline, and it expired unrun)."""
        rate = self._admitting_rate(config, variant, bulk)
        if rate <= 0 or self._room(config, variant, bulk, start_by, rate) is not None:
            return None
        return self._backlog((config.name, variant)).waiting[1 if bulk else 0]

    def _room(
        self, config: ModelConfig, variant: str, bulk: bool, start_by: StartBy, rate: float
    ) -> int | None:
        """Entries that may wait undelivered ahead of the job at `rate`, or None when it is late
        with none: the stall alone passes `start_by`, or the lane's dead worker's entries (run
        first once reclaimed, counted ahead by its position and ETA) take all of its budget.
        ENQUEUE counts only the undelivered entries, so the bound leaves those out: it let in
        jobs whose 202 ETA, which counts them, was past their deadline."""
        if self._stalls.get((config.name, variant), 0) > start_by.budget_ms:
            return None
        room = most_ahead(rate, start_by.budget_ms) - self._abandoned_in(config, variant, bulk)
        return None if room < 0 else room

    def _abandoned_in(self, config: ModelConfig, variant: str, bulk: bool) -> int:
        """A dead worker's entries in the lane at the last refresh (`AbandonedEntries`)."""
        lane = (self.keys.bulk_queue if bulk else self.keys.queue)(config.name, variant)
        return self._abandoned.get(lane, 0)

    def _admitting_rate(self, config: ModelConfig, variant: str, bulk: bool) -> float:
        """The lane's rate when the model admits by deadline and the workers' capacity is
        known, else 0 (no deadline admission)."""
        if not config.queue.admit_by_deadline or (config.name, variant) not in self._capacity:
            return 0.0
        return self.lane_rate(config, variant, bulk)

    def admission(self, config: ModelConfig, variant: str) -> Admission:
        """`max_ahead` for a job of the partition enqueued other than by a submit (a dead
        letter's replay), by its lane, enqueue stamp and deadline, or None where the stall
        alone makes it late (`stalled_ahead`, which ENQUEUE's bound cannot refuse on an empty
        lane): it is refused as a submit would be, rather than enqueued only to expire. No
        Redis call: the last refresh's rates and backlog."""

        def max_ahead(bulk: bool, enqueued_ms: float, deadline_ms: int) -> int | None:
            start_by = StartBy.of(config, enqueued_ms, deadline_ms)
            if self.stalled_ahead(config, variant, bulk, start_by) is not None:
                return None
            return self.max_ahead(config, variant, bulk, start_by)

        return max_ahead

    async def of(self, record: JobRecord) -> Standing | None:
        """A queued job's standing (one round trip), or None for a job enqueued before
        positions were kept or whose model is gone."""
        fields = record.fields
        config = self.repository.get(fields.get("model", ""))
        stream, seq, variant = fields.get("stream"), fields.get("seq"), fields.get("variant", "")
        if config is None or not stream or not (seq or fields.get("held")):
            return None
        tenant = fields.get("tenant", "default")
        place = fields.get("hseq")
        position = await self.positions.position(stream, int(seq) if seq else None, tenant, place)
        bulk = stream == self.keys.bulk_queue(config.name, variant)
        return self.standing(config, variant, bulk, position)
