"""The dynamic-batching loop of one partition of a `batch` model: read a micro-batch, drop what
must not run (cancelled, expired), run the rest in one engine call, write everything back. A
staged engine's micro-batches go through a stage pipeline instead, so the loop reads and
tokenises the next micro-batch while the device runs this one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from opentelemetry.trace import Span

from shared.codec import dumps
from shared.job_states import JobStatus
from workers.batching.batch_budget import BatchBudget
from workers.batching.busy_time import BusyTime
from workers.batching.long_run import LongRun
from workers.batching.micro_batch_executor import Outcome, engine_calls, execute
from workers.batching.micro_batch_telemetry import (
    current_span,
    end_span,
    log_batch,
    record_batch,
    record_ended,
    record_failures,
    stage_span,
    start_batch_span,
)
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import BatchEngine, EngineDied, StagedBatchEngine
from workers.partition.finish import Finish, ended_as_finished
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.redis_backoff import Stopped, serve_until_stopped, until_done
from workers.partition.result_writer import ResultWriter
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import Delivery, LaneEntry, StreamReader

log = logging.getLogger(__name__)


def engine_item(payload: dict[str, Any]) -> Any:
    """A job's inputs as its engine reads them, with its parameters (`parameters`) where it has
    some: only an embed model's job takes any (`truncate`, `shared.job_parameters`). The
    inputs of a job without are passed as they are, no copy made."""
    inputs = payload.get("inputs", {})
    parameters = payload.get("parameters")
    if parameters and isinstance(inputs, dict):
        return {**inputs, "parameters": parameters}
    return inputs


@dataclass(frozen=True, slots=True)
class Claimed:
    """A micro-batch read and kept claimed (`watch`) until its write-back: what runs, and the
    results of what must not (cancelled, expired)."""

    stream: str
    runnable: list[Delivery]
    skipped: list[Finish]
    watch: LongRun
    read_at: float  # time.monotonic(), when its read handed it over


class MicroBatchLoop:
    def __init__(
        self,
        partition: Partition,
        lanes: LaneScheduler,
        reader: StreamReader,
        writer: ResultWriter,
        engine: BatchEngine,
        block_ms: int,
    ) -> None:
        self.partition = partition
        self.lanes = lanes
        self.reader = reader
        self.in_hand: set[LaneEntry] = set()  # entries read and not yet written back
        self.writer = writer
        self.engine = engine
        self.block_ms = block_ms
        self.budget = BatchBudget(partition.max_batch_size, partition.config.queue.fair_batch_ms)
        self.busy = BusyTime(*partition.labels)
        self.stopping = Stopping()
        self.stages = StagePipeline(engine) if isinstance(engine, StagedBatchEngine) else None
        self.hung: EngineDied | None = None  # an engine call ran past `queue.max_run_s`
        self._running: asyncio.Task[None] | None = None  # `run`'s, which `hung` cancels

    async def run(self) -> None:
        """Serve until asked to stop; the micro-batch in hand is finished and acknowledged (or,
        when Redis is gone at stop, left pending for another worker to reclaim). Redis outages
        pause the loop (capped backoff) without losing the consumer's entries. An engine call
        past `queue.max_run_s` ends it with EngineDied, its micro-batches left pending."""
        self._running = asyncio.current_task()
        try:
            await self._serve()
        except asyncio.CancelledError:
            if self.hung is None:
                raise
            raise self.hung from None

    async def _serve(self) -> None:
        """Until stopped, or hung: `_hung` cancels it (a Redis call that lost the cancel raises
        it all the same: shared/redis_client.py)."""
        try:
            await serve_until_stopped(
                self.step, self.stopping, self.partition.name, self.lanes.outage
            )
        finally:  # a loop that failed, too: its engine is closed once nothing runs on it
            await self._drain()

    async def _drain(self) -> None:
        """Finish and write back the micro-batches still in the stage pipeline; a hung engine's
        never finish, and its threads never stop: the worker exits without them."""
        if self.stages is None or self.hung is not None:
            return
        try:
            with contextlib.suppress(Stopped):
                await self.stages.drain()
        finally:
            if self.hung is None:
                self.stages.close()

    async def step(self) -> None:
        if self.stages is not None:
            await self.stages.until_wanted()
            if self.stopping.is_set():  # asked meanwhile: a read now would run past the stop
                return
        batches = await self.lanes.next_batch(
            self.budget.limit(),
            self.partition.config.max_queue_delay_ms,
            self.block_ms,
            self.in_hand,
            stop=self.stopping,
        )
        await self._in_turn([self.claim(stream, batch) for stream, batch in batches])

    async def process(self, stream: str, batch: list[Delivery]) -> None:
        """Claim and run one micro-batch."""
        await self._in_turn([self.claim(stream, batch)])

    async def _in_turn(self, waiting: list[Claimed]) -> None:
        """Run claimed micro-batches one after another, each kept claimed from its read: a
        blocking read can return both lanes', and the second's entries, untouched while the
        first ran, were reclaimed and run again by another worker. Those an error (an engine
        that died) left unwritten go back untouched."""
        try:
            while waiting:
                await self._run(waiting[0])
                waiting.pop(0)
        finally:
            for claimed in waiting:
                claimed.watch.end()

    def claim(self, stream: str, batch: list[Delivery]) -> Claimed:
        """Sort a micro-batch just read into what runs and what must not, and keep all its
        entries claimed until its write-back (which writes back those that must not, too)."""
        self.in_hand.update((stream, delivery.entry_id) for delivery in batch)
        self.budget.read(batch)
        skipped: list[Finish] = []
        runnable: list[Delivery] = []
        for delivery in batch:
            finish = self.partition.skip_or_expire(delivery)
            if finish is None:
                runnable.append(delivery)
            else:
                skipped.append(finish)
        record_ended(self.partition, batch)
        queue = self.partition.config.queue
        watch = LongRun(
            self.reader,
            stream,
            batch,
            runnable,
            self.partition.touch_every_s,
            queue.max_run_s,
            self._hung,
        )
        return Claimed(stream, runnable, skipped, watch, time.monotonic())

    async def _run(self, claimed: Claimed) -> None:
        """Under the micro-batch's span, which its write-back ends (`complete`): a staged
        engine's runs on in the stage pipeline after this returns."""
        span = start_batch_span(*self.partition.labels, claimed.runnable)
        try:
            with current_span(span):
                with stage_span("decode"):
                    inputs = [engine_item(d.entry.payload) for d in claimed.runnable if d.entry]
                done = partial(self.complete, claimed, span)
                if self.stages is not None and inputs:  # bounded once it holds a pipeline slot
                    await self.stages.submit(inputs, done, claimed.watch)
                    return
                claimed.watch.started()
                with stage_span("engine"):
                    outcomes = await execute(self.engine, inputs)
                await done(outcomes)
        except BaseException:
            end_span(span)
            raise

    def _hung(self) -> None:
        """A micro-batch's engine call ran past `queue.max_run_s`: the engine is deemed dead
        (it never returns), so the loop ends as it does on EngineDied and the worker exits."""
        if self.hung is not None:
            return
        max_run_s = self.partition.config.queue.max_run_s
        self.hung = EngineDied(
            f"{self.partition.name}: a micro-batch ran past queue.max_run_s ({max_run_s:g} s):"
            " the engine is deemed hung"
        )
        if self._running is not None:
            self._running.cancel()

    async def complete(self, claimed: Claimed, span: Span | None, outcomes: list[Outcome]) -> None:
        """Write a micro-batch's results and its skipped entries back in one round trip (no
        touch meanwhile: while Redis takes no write-back it takes no touch either); its span
        ends then, with its failed jobs on it."""
        try:
            record_failures(span, claimed.runnable, outcomes)
            await self._write_back(claimed, outcomes)
        finally:
            end_span(span)

    async def _write_back(self, claimed: Claimed, outcomes: list[Outcome]) -> None:
        claimed.watch.end()
        stream, runnable = claimed.stream, claimed.runnable
        finishes = claimed.skipped + [
            self._result(d, o) for d, o in zip(runnable, outcomes, strict=True)
        ]
        with stage_span("write"):
            written = await until_done(
                lambda: self.writer.finish(stream, finishes), self.stopping, self.partition.name
            )
        self.in_hand.difference_update((stream, finish.entry_id) for finish in finishes)
        self.busy.held(claimed.read_at, time.monotonic())
        # a job run twice after a reclaim counted once, where written; one the API ended while
        # it ran, in the end FINISH met. The writer samples only what it wrote for the variant
        # statistics: an end the API gave is none
        ended = ended_as_finished(written, finishes)
        calls = engine_calls(outcomes)
        record_batch(self.partition, stream, ended, calls)
        for outcome in calls:
            self.budget.ran(outcome.batch_size, outcome.engine_ms / 1000.0)
        if runnable:
            log_batch(self.partition.config.name, runnable, written)

    def _result(self, delivery: Delivery, outcome: Outcome) -> Finish:
        fields = {
            "engine_ms": str(outcome.engine_ms),
            "batch_size": str(outcome.batch_size),
            "batch_id": outcome.batch_id,
        }
        if outcome.error is not None:
            fields["error"] = dumps(outcome.error).decode()
            return self.partition.finish(delivery, JobStatus.FAILED, fields, outcome.ran_ms)
        fields["outputs"] = outcome.written
        return self.partition.finish(delivery, JobStatus.SUCCEEDED, fields, outcome.ran_ms)
