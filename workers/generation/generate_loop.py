"""The continuous-batching loop of one partition of a `generate` model. Admission is not tied to
micro-batches: whenever an engine slot is free the loop reads (and claims) as many entries as
there are free slots and starts them at once. Every engine step's new text of ALL running jobs
goes to their token streams in one pipelined round trip, which also reads back their statuses
(a cancelled job is aborted after the next step; one the engine yields nothing for, within
`STATUS_POLL_S`), and each job is acknowledged as it ends. An
engine that stepped and ended no generation for `queue.max_run_s` while it had some is deemed
hung, and handled as a dead one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import replace

from shared.codec import as_text, dumps
from shared.generate_errors import ContextLengthExceeded
from shared.job_states import INVALID_PARAMETERS, TERMINAL, JobStatus
from shared.job_store import now_ms
from shared.metrics import BATCH_SIZE, GENERATE_BUSY, TOKENS, TPOT, TTFT
from shared.token_stream import TokenEvent
from workers.batching.micro_batch_telemetry import (
    batch_span,
    record_batch,
    record_ended,
)
from workers.engines.base import EngineDied, GenerateEngine, TokenChunk
from workers.generation.generate_job import (
    InvalidChunk,
    RunningJob,
    checked,
    engine_failure,
    generate_request,
)
from workers.partition.finish import Finish, ended_as_finished
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.redis_backoff import (
    OUTAGE,
    OutageLog,
    Stopped,
    serve_until_stopped,
    until_done,
)
from workers.partition.result_writer import ResultWriter
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import Delivery, LaneEntry, StreamReader
from workers.partition.token_writer import EntryHolder, TickWritten, TokenAppend, TokenWriter

log = logging.getLogger(__name__)
# How long a drain waits for the generations it aborted: an abort ends one within an engine step;
# an engine that ignores it must not hold the drain into the grace left for the engine's close.
ABORT_S = 2.0
# How soon a drain tries again a touch that an outage failed.
TOUCH_RETRY_S = 0.5
# How often every running job's status is read back, not only those of the jobs that stepped: a
# job the engine yields nothing for (waiting in vLLM behind others, a long prefill) had its
# cancel go unseen, its slot held, until its first chunk, as long as the jobs ahead of it ran.
STATUS_POLL_S = 1.0


class EngineWatch:
    """When the engine last showed life (a chunk, a generation's end) while it had generations,
    to tell a hung engine (vLLM's engine core wedged: the process alive, `dead()` false, no
    error ever raised) from a busy one: its loop re-claimed the hung generations for ever."""

    def __init__(self, max_run_s: float) -> None:
        self.max_run_s = max_run_s  # 0: no ceiling
        self.generating = 0
        self.lively_at = time.monotonic()
        self.steps: int | None = None  # the engine's own count of steps, where it keeps one

    @contextlib.contextmanager
    def generation(self, job: RunningJob) -> Iterator[None]:
        """One generation in the engine; an idle engine owes no step for its idle time. An end
        this loop's abort made (`RunningJob.let_go`) shows no life of the engine: a wedged one
        ends its generations on abort all the same (`VllmEngine.abort`), and clients giving up
        on it one after another kept it from ever being deemed hung."""
        if not self.generating:
            self.stepped()
        self.generating += 1
        try:
            yield
        finally:
            self.generating -= 1
            if not job.let_go:
                self.stepped()

    def stepped(self) -> None:
        self.lively_at = time.monotonic()

    def hung(self, steps: int | None = None) -> bool:
        """Generations ran, and none stepped or ended for `max_run_s`. `steps`: the engine's
        count of its steps (vLLM's), where it keeps one: a step may decode text that shows
        nothing yet (special tokens skipped), and a long run of them yields no chunk."""
        if steps is not None and steps != self.steps:
            self.steps = steps
            self.stepped()
        quiet_s = time.monotonic() - self.lively_at
        return bool(self.max_run_s and self.generating) and quiet_s > self.max_run_s


class GenerateLoop:
    def __init__(
        self,
        partition: Partition,
        lanes: LaneScheduler,
        reader: StreamReader,
        writer: ResultWriter,
        tokens: TokenWriter,
        engine: GenerateEngine,
        block_ms: int,
        drain_s: float,
    ) -> None:
        self.partition = partition
        self.lanes = lanes
        self.reader = reader
        self.writer = writer
        self.tokens = tokens
        self.engine = engine
        self.block_ms = block_ms
        self.drain_s = drain_s
        self.capacity = partition.config.max_num_seqs
        self.running: dict[str, RunningJob] = {}
        self.settling: set[LaneEntry] = set()  # entries of ended jobs not yet written back
        self.stopping = Stopping()
        # Set once the drain is over: the publisher's writes ride out an outage until then, as
        # the drain's touches do. They gave up at their first failure once a stop was asked: a
        # blip then (a failover during a rolling restart) left the generations that finished
        # in the drain unwritten, to run again elsewhere a visibility timeout later.
        self._drained = asyncio.Event()
        self._chunks: list[tuple[RunningJob, TokenChunk, int]] = []
        self._ended: list[RunningJob] = []
        self._given_up: list[RunningJob] = []  # a drain's: handed back once the publisher ends
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # Running entries are re-claimed (idle reset) well within the visibility timeout, so a
        # long generation is never mistaken for an abandoned one and run twice.
        self._touch_every_s = partition.touch_every_s
        self._next_touch = time.monotonic() + self._touch_every_s
        self._polled_at = time.monotonic()
        self._busy_mark = time.monotonic()
        self._watch = EngineWatch(partition.config.queue.max_run_s)
        self.engine_death: BaseException | None = None

    async def run(self) -> None:
        """Serve until asked to stop; then admit nothing more, give running generations up to
        `drain_s` to finish, and abort the rest, handing their entries back unacknowledged for
        the next reclaim (another worker reruns them); a dead or hung engine's are given up at
        once, left to the visibility timeout, and EngineDied raised. With Redis gone at stop,
        what is unwritten stays pending for another worker to reclaim."""
        publisher = asyncio.create_task(self._publish_loop(), name="token-publisher")
        try:
            await self._admit_loop(publisher)
        finally:
            self.stopping.set()
            await self._drain()
            self._drained.set()
            self._wake.set()
            with contextlib.suppress(Stopped):
                await publisher
            await self._hand_back()
        if self.engine_death is not None:
            death = f"{self.partition.name}: the engine died: {self.engine_death!r}"
            raise EngineDied(death) from self.engine_death

    async def _admit_loop(self, publisher: asyncio.Task[None]) -> None:
        """Admit until asked to stop, or until the publisher died (its error then surfaces)."""
        await serve_until_stopped(
            self._admit,
            self.stopping,
            self.partition.name,
            self.lanes.outage,
            lambda: not publisher.done(),
        )

    async def _admit(self) -> None:
        """Fill free slots: a reclaimed entry first (one at a time, `LaneScheduler`), then online
        before bulk. Blocks up to `block_ms` when no slot is free or nothing is queued (which
        bounds noticing a hung engine: nothing more is touched or admitted then; a stop ends
        the block at once)."""
        if self._watch.hung(getattr(self._step_stats(), "steps", None)):
            self._hung()
            return
        await self._touch_running()
        free = self.capacity - len(self.running)
        if free <= 0:  # a stop ends the wait at once: the drain begins then, not a block later
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await self.stopping.unless_set(
                    lambda: asyncio.wait_for(self._slot_freed.wait(), self.block_ms / 1000)
                )
            return
        in_hand = self.settling.union(
            (job.stream, job.delivery.entry_id) for job in self.running.values()
        )
        batches = await self.lanes.next_batch(
            free, 0, self.block_ms, in_hand, slots=True, stop=self.stopping
        )
        for stream, deliveries in batches:
            await self._start_all(stream, deliveries)

    async def _start_all(self, stream: str, deliveries: list[Delivery]) -> None:
        """Start each delivery, or settle one that must not run; a taken-over one's dead run
        left its token stream behind (`TokenWriter.ended`)."""
        settled: list[Finish] = []
        dead_runs: list[str] = []
        for delivery in deliveries:
            if delivery.entry is not None and delivery.entry.job_id in self.running:
                continue  # our own entry, reclaimed while it runs: it is still ours
            record_ended(self.partition, [delivery])
            if (skipped := self.partition.skip_or_expire(delivery)) is not None:
                settled.append(skipped)
                if delivery.redelivered and delivery.entry is not None:
                    dead_runs.append(delivery.entry.job_id)
            elif (failed := self._start(stream, delivery)) is not None:
                settled.append(failed)
        await self._settle(stream, settled, self.stopping)
        if dead_runs:
            ended = self.tokens.ended
            await until_done(lambda: ended(dead_runs), self.stopping, self.partition.name)

    def _start(self, stream: str, delivery: Delivery) -> Finish | None:
        """Start generating; a job whose parameters the engine cannot take fails alone."""
        assert delivery.entry is not None
        entry = delivery.entry
        try:
            request = generate_request(entry.job_id, entry.payload, self.engine.parameters)
        except (TypeError, ValueError) as exc:
            error = dumps({"type": INVALID_PARAMETERS, "message": str(exc)}).decode()
            return self.partition.finish(delivery, JobStatus.FAILED, {"error": error})
        job = RunningJob(delivery, stream, request, delivery.redelivered)
        self._clock_busy()
        self.running[entry.job_id] = job
        job.task = asyncio.create_task(self._generate(job), name=f"generate {entry.job_id}")
        return None

    async def _generate(self, job: RunningJob) -> None:
        """Feed the job's chunks to the publisher; an engine error fails this job only."""
        try:
            with (
                self._watch.generation(job),
                batch_span(*self.partition.labels, [job.delivery], "generate"),
            ):
                async for chunk in self.engine.generate(job.request):
                    if not job.let_go:
                        self._watch.stepped()
                    self._chunks.append((job, checked(chunk), now_ms()))
                    self._wake.set()
        except InvalidChunk as exc:
            job.error = {"type": "InvalidOutput", "message": str(exc)}
            await self._abort_quietly(job.job_id)  # the engine goes on generating otherwise
        except Exception as exc:
            if self.engine.dead():
                job.abandoned = True
                self.engine_died(exc)
            else:
                job.error = engine_failure(exc)
                if isinstance(exc, ContextLengthExceeded):  # its usage said 0 prompt tokens
                    job.prompt_tokens = exc.prompt_tokens
        if job.error:
            log.warning("generation failed", extra={"job_id": job.job_id, "error": job.error})
        self._ended.append(job)
        self._wake.set()

    def _hung(self) -> None:
        """No generation stepped or ended for `queue.max_run_s`: handled as a dead engine."""
        max_run_s = self._watch.max_run_s
        self.engine_died(
            TimeoutError(
                f"no generation stepped or ended for queue.max_run_s ({max_run_s:g} s): "
                "the engine is deemed hung"
            )
        )

    def engine_dead(self) -> bool:
        """Whether its engine died, by the engine's own look (the runtime's `EngineDeaths`)."""
        return self.engine.dead()

    def raised_for_death(self, error: BaseException) -> bool:
        """Whether `error` is the EngineDied `run` raised for the death it logged."""
        return self.engine_death is not None and error.__cause__ is self.engine_death

    def engine_died(self, cause: Exception) -> None:
        """A dead engine fails every job at once, through no fault of theirs: failing them
        emptied the queue within seconds while the worker lived on. Its jobs are left pending
        (no result, no final event: a rerun elsewhere restarts its stream) and the loop stops,
        so the worker exits. Called by the runtime too, for a death its look found."""
        if self.engine_death is None:
            log.critical("the engine died: %r; handing jobs back and exiting", cause)
            self.engine_death = cause
            self.stopping.set()

    async def _abort_quietly(self, job_id: str) -> None:
        """An engine's abort that raises (a request it already let go) fails nothing else: it
        used to stop the publisher that writes every running job's tokens."""
        try:
            await self.engine.abort(job_id)
        except Exception:
            log.exception("could not abort a generation", extra={"job_id": job_id})

    async def _publish_loop(self) -> None:
        while self.running or self._chunks or self._ended or not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):  # a tick at least once a status poll
                await asyncio.wait_for(self._wake.wait(), self._until_poll())
            self._wake.clear()
            await asyncio.sleep(0)  # the rest of this engine step's chunks land in this tick
            chunks, self._chunks = self._chunks, []
            ended, self._ended = self._ended, []
            await self._publish(chunks, ended)

    async def _publish(
        self, chunks: list[tuple[RunningJob, TokenChunk, int]], ended: list[RunningJob]
    ) -> None:
        """One tick: the step's token events, one round trip; then abort what the API cancelled,
        acknowledge what ended, and append the finals of what ended."""
        self._clock_busy()
        running_now = self._engine_running()
        events: dict[str, tuple[RunningJob, list[TokenEvent]]] = {}
        stepped: dict[str, RunningJob] = {}
        for job, chunk, at_ms in chunks:
            if job.abandoned:  # given up: its tokens are another run's to write
                continue
            events.setdefault(job.job_id, (job, []))[1].extend(job.take(chunk, at_ms, running_now))
            stepped[job.job_id] = job
        for job in ended:
            if not job.abandoned:
                events.setdefault(job.job_id, (job, []))[1].extend(job.closing_events())
        appends = [(job, self._append(job, e)) for job, e in events.values() if e]
        written = await self._write(appends, self._watched(stepped, ended))
        # refused: another worker took the job over, or wrote its stream since (a reclaim)
        await self._give_up(events[job_id][0] for job_id in written.refused)
        self._observe_step(chunks, len(stepped))
        await self._abort_ended(written.statuses)
        await self._write_finals(await self._finish(ended))

    def _until_poll(self) -> float:
        """Seconds until every running job's status is due (`_watched`). A wait of a whole
        STATUS_POLL_S after each tick let a tick just short of the poll put it off by as much
        again: a cancelled job the engine yielded nothing for was aborted up to 2 s later."""
        return max(0.0, self._polled_at + STATUS_POLL_S - time.monotonic())

    def _watched(self, stepped: dict[str, RunningJob], ended: list[RunningJob]) -> list[str]:
        """The jobs whose statuses the tick reads back: those that stepped or ended (a cancel in
        the step that ended one makes it end `cancelled`), and once per `STATUS_POLL_S` every
        running one, for the jobs that yield nothing to be seen by."""
        jobs: Iterable[RunningJob] = stepped.values()
        if (now := time.monotonic()) >= self._polled_at + STATUS_POLL_S:
            self._polled_at = now
            jobs = self.running.values()
        due = (job for job in (*jobs, *ended) if job.ended_as is None and not job.abandoned)
        return list(dict.fromkeys(job.job_id for job in due))

    def _append(self, job: RunningJob, events: list[TokenEvent]) -> TokenAppend:
        """The job's next append, taken only while this consumer still holds its lane entry."""
        holder = EntryHolder(job.stream, job.delivery.entry_id, self.reader.consumer)
        return replace(job.append(events), holder=holder)

    async def _write(
        self, appends: list[tuple[RunningJob, TokenAppend]], watch: list[str]
    ) -> TickWritten:
        """The tick's round trip, retried through an outage until the drain is over; each try
        leaves out the jobs given up meanwhile (a touch found them taken over, a drain let them
        go): the write built before the outage wrote them all."""
        return await until_done(
            lambda: self.tokens.write([a for job, a in appends if not job.abandoned], watch),
            self._drained,
            self.partition.name,
        )

    def _clock_busy(self) -> None:
        """Count the wall time since the last call if a generation ran through it: tokens per
        busy second is the throughput a worker reports for backlog seconds (shared/backlog.py)."""
        now = time.monotonic()
        if self.running:
            GENERATE_BUSY.labels(*self.partition.labels).inc(now - self._busy_mark)
        self._busy_mark = now

    def _engine_running(self) -> int:
        """Requests the engine decoded in its last step, where the engine reports it."""
        running = getattr(self._step_stats(), "last_running", 0)
        return int(running) if running else len(self.running)

    def _step_stats(self) -> object | None:
        """What the engine reports of its steps (vLLM's `StepStats`), if it reports any."""
        return getattr(self.engine, "step_stats", None)

    def _observe_step(self, chunks: list[tuple[RunningJob, TokenChunk, int]], jobs: int) -> None:
        partition = self.partition.labels
        if jobs:
            BATCH_SIZE.labels(*partition).observe(jobs)
        if tokens := sum(chunk.token_count for _, chunk, _ in chunks):
            TOKENS.labels(*partition).inc(tokens)

    async def _abort_ended(self, statuses: dict[str, str | None]) -> None:
        """A job whose hash turned terminal behind our back (cancelled through the API) or
        vanished is aborted: the engine frees its slot within one step."""
        for job_id, status in statuses.items():
            job = self.running.get(job_id)
            if job is None or job.ended_as is not None:
                continue
            if status is None or status in TERMINAL:  # a StrEnum member matches its string
                job.ended_as = status or JobStatus.CANCELLED.value
                log.info("aborting %s job", job.ended_as, extra={"job_id": job_id})
                await self._abort_quietly(job_id)

    async def _finish(self, ended: list[RunningJob]) -> list[RunningJob]:
        """Write the results of the jobs that ended; returns those whose final is due: the ones
        FINISH wrote, and the ones the API ended (their records say so). One the API ended
        after the tick read its status back, before FINISH, ends as the record says (its final
        says `cancelled`, as the record does), and so does one FINISH failed for its size."""
        by_stream: dict[str, list[Finish]] = defaultdict(list)
        for job in ended:
            self.running.pop(job.job_id, None)
            if job.abandoned:
                continue
            finish = self.partition.finish(job.delivery, job.status, job.fields())
            finish.streamed = True  # its client read its tokens: a cancel met keeps them
            by_stream[job.stream].append(finish)
            self._observe_job(job)
        # in hand until written back, from now: the admit loop may read our pending list
        self.settling.update((s, f.entry_id) for s, finishes in by_stream.items() for f in finishes)
        settled: dict[str, Finish] = {}
        for stream, finishes in by_stream.items():
            settled |= await self._settle(stream, finishes, self._drained)
        if ended:
            self._slot_freed.set()
        for job in ended:
            if (record := settled.get(job.job_id)) is not None:
                job.settle(record)
        return [
            job
            for job in ended
            if not job.abandoned and (job.ended_as is not None or job.job_id in settled)
        ]

    async def _write_finals(self, jobs: list[RunningJob]) -> None:
        """Append the finals of ended jobs once FINISH made their records terminal. A final
        written before FINISH let a cancel that landed in between win: the record `cancelled`,
        its stream's final `succeeded`. Now a cancel after FINISH is refused as one of an ended
        job (an abort after the last token is a no-op in vLLM too), and one before it is read by
        the tick that ended the job, or, landing after that tick's read, told by FINISH, which
        met it (`Finish.met`); the job then ends `cancelled`. Unchecked (no lane-entry
        holder): FINISH acknowledged the entry, and wrote only what this consumer held."""
        appends = [job.append([job.final_event()]) for job in jobs]
        if appends:
            write = self.tokens.write
            await until_done(lambda: write(appends, []), self._drained, self.partition.name)

    async def _settle(
        self, stream: str, finishes: list[Finish], stop: asyncio.Event
    ) -> dict[str, Finish]:
        """Write results, reply, XACK and XDEL in one script call, retried through an outage
        until `stop` (the admit loop's stop, the publisher's end of the drain), then notify and
        count. The entries stop counting as in hand once written back (`_finish` counts them
        from when their jobs end; the admit loop's own settles finish before it reads again).
        Returns what each job ended as here: the results it wrote (one failed for its size
        among them), and the ends the API gave the rest (`Finish.met`)."""
        if not finishes:
            return {}
        try:
            written = await until_done(
                lambda: self.writer.finish(stream, finishes), stop, self.partition.name
            )
        finally:
            self.settling.difference_update((stream, finish.entry_id) for finish in finishes)
        # FINISH tells the end the API gave a job, even one made after the tick read the job's
        # status back (such a job counted in no state and got no final)
        ended = ended_as_finished(written, finishes)
        record_batch(self.partition, stream, ended, [])
        return {f.job_id: f for f in ended}

    def _observe_job(self, job: RunningJob) -> None:
        partition = self.partition.labels
        if (ttft := job.ttft_ms) is not None:
            TTFT.labels(*partition).observe(ttft / 1e3)
        if (tpot := job.tpot_ms) is not None:
            TPOT.labels(*partition).observe(tpot / 1e3)

    async def _touch_running(self) -> None:
        """XCLAIM (JUSTID: the delivery count stays) the entries of running jobs. The next
        touch is scheduled once these succeeded: one an outage failed is tried again on the
        next admit, not a third of the visibility timeout later, when a reclaimer may already
        have taken a job still generating here."""
        if time.monotonic() < self._next_touch or not self.running:
            return
        for stream, entry_ids in _entries_by_stream(self.running.values()).items():
            lost = set(await self.reader.touch(stream, entry_ids))
            await self._give_up(
                job
                for job in list(self.running.values())
                if job.stream == stream and as_text(job.delivery.entry_id) in lost
            )
        self._next_touch = time.monotonic() + self._touch_every_s

    async def _give_up(self, jobs: Iterable[RunningJob]) -> None:
        """Abort generations another worker took over (this one could not reach Redis for a
        visibility timeout) or finished: no more of their tokens, no result."""
        for job in jobs:
            if not job.abandoned:
                job.abandoned = True
                log.warning(
                    "another worker took the job over; giving it up", extra={"job_id": job.job_id}
                )
                await self._abort_quietly(job.job_id)

    async def _drain(self) -> None:
        if self.engine_death is not None:
            await self._cancel()
            return
        jobs = list(self.running.values())
        tasks = {job.task for job in jobs if job.task is not None}
        if not tasks:
            return
        await self._wait_touching(tasks)
        for job in jobs:  # (one another worker took over meanwhile is given up already)
            if job.task is not None and not job.task.done() and not job.abandoned:
                job.abandoned = True
                log.warning("abandoning unfinished generation", extra={"job_id": job.job_id})
                await self._abort_quietly(job.job_id)
                self._given_up.append(job)
        _, ignored = await asyncio.wait(tasks, timeout=ABORT_S)
        if ignored:  # the engine honours no abort (hung, not yet deemed so)
            await self._cancel()

    async def _hand_back(self) -> None:
        """A drain's given-up generations are due to the next reclaim, their run uncounted
        (`StreamReader.hand_back`): they waited out the visibility timeout (smollm2's 300 s)
        as if this worker had crashed, and two rolling restarts dead-lettered a healthy job.
        Not an engine's death: the input may have killed it, and that run counts."""
        idle_ms = int(self.partition.config.queue.visibility_timeout_s * 1000)
        try:
            for stream, entry_ids in _entries_by_stream(self._given_up).items():
                handed = await self.reader.hand_back(stream, entry_ids, idle_ms)
                # an operator reading a rolling restart's log sees where those jobs went
                log.info(
                    "handed given-up generations back to the next reclaim",
                    extra={"stream": stream, "handed": handed, "given_up": len(entry_ids)},
                )
        except OUTAGE as exc:  # left pending: reclaimed a visibility timeout on, as before
            log.warning("could not hand back given-up generations: %r", exc)

    async def _wait_touching(self, tasks: set[asyncio.Task[None]]) -> None:
        """Wait up to `drain_s` for the generations to end, touching their entries when due as
        the admit loop did: a drain longer than two thirds of the visibility timeout let another
        worker's reclaimer take over generations still running here (a false `crashed` attempt,
        the job run twice, the nearly finished run given up)."""
        deadline = time.monotonic() + self.drain_s
        outage = OutageLog(f"{self.partition.name} drain")
        while tasks and (left_s := deadline - time.monotonic()) > 0:
            try:
                await self._touch_running()
                outage.recovered()
            except OUTAGE as exc:  # tried again a slice later; unreachable, none reclaims either
                outage.failed(exc)
            due_s = self._next_touch - time.monotonic()
            slice_s = due_s if due_s > 0 else min(self._touch_every_s, TOUCH_RETRY_S)
            _, tasks = await asyncio.wait(tasks, timeout=min(left_s, slice_s))

    async def _cancel(self) -> None:
        """A dead or hung engine's generations are given up at once, left pending: a hung one
        neither ends nor aborts them, and its drain waited on them for ever (so did a drain's
        wait for the generations it aborted). Each goes to the publisher as ended, abandoned,
        which lets it go."""
        given_up: list[tuple[RunningJob, asyncio.Task[None]]] = []
        for job in self.running.values():
            if job.task is not None and not job.task.done():
                job.abandoned = True
                job.task.cancel()
                given_up.append((job, job.task))
        await asyncio.gather(*(task for _, task in given_up), return_exceptions=True)
        self._ended.extend(job for job, task in given_up if task.cancelled())


def _entries_by_stream(jobs: Iterable[RunningJob]) -> dict[str, list[bytes]]:
    entries: dict[str, list[bytes]] = defaultdict(list)
    for job in jobs:
        entries[job.stream].append(job.delivery.entry_id)
    return entries
