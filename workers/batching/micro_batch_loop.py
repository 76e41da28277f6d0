"""The dynamic-batching loop of one partition of a `batch` model: read a micro-batch, drop what
must not run (cancelled, expired), run the rest in one engine call, write everything back."""

from __future__ import annotations

import asyncio
import logging

from shared.codec import dumps
from shared.job_states import JobStatus
from workers.batching.micro_batch_executor import Outcome, execute
from workers.batching.micro_batch_telemetry import batch_span, log_batch, record_batch, tracer
from workers.engines.base import BatchEngine
from workers.partition.partition_io import PartitionIO
from workers.partition.result_writer import Finish
from workers.partition.stream_reader import Delivery
from workers.runtime.redis_backoff import OUTAGE, Backoff, until_done

log = logging.getLogger(__name__)


class MicroBatchLoop:
    def __init__(self, io: PartitionIO, engine: BatchEngine) -> None:
        self.io = io
        self.engine = engine
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        """Serve until asked to stop; the batch in hand is always finished and acknowledged.
        Redis outages pause the loop (capped backoff) without losing the consumer's entries."""
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                await self.step()
                backoff.reset()
            except OUTAGE as exc:
                await backoff.sleep(exc)

    async def step(self) -> None:
        if reclaimed := await self.io.reclaimed():
            await self.process(*reclaimed)
            return
        batches = await self.io.lanes.next_batch(
            self.io.config.max_batch_size, self.io.config.max_queue_delay_ms, self.io.block_ms
        )
        for reader, batch in batches:
            await self.process(reader.stream, batch)

    async def process(self, stream: str, batch: list[Delivery]) -> None:
        finishes: list[Finish] = []
        runnable: list[Delivery] = []
        for delivery in batch:
            finish = self._skip_or_expire(delivery)
            if finish is None:
                runnable.append(delivery)
            else:
                finishes.append(finish)
        model, variant = self.io.config.name, self.io.variant
        with batch_span(model, variant, runnable):
            with tracer.start_as_current_span("decode"):
                inputs = [d.entry.payload.get("inputs", {}) for d in runnable if d.entry]
            with tracer.start_as_current_span("engine"):
                outcomes = await execute(self.engine, inputs)
            finishes += [self._result(d, o) for d, o in zip(runnable, outcomes, strict=True)]
            with tracer.start_as_current_span("write"):
                written = await until_done(lambda: self.io.writer.finish(stream, finishes))
        await self.io.webhooks.notify(written)
        record_batch(model, variant, finishes, outcomes)
        if runnable:
            log_batch(model, runnable, outcomes)

    def _skip_or_expire(self, delivery: Delivery) -> Finish | None:
        return self.io.skip_or_expire(delivery)

    def _result(self, delivery: Delivery, outcome: Outcome) -> Finish:
        fields = {
            "engine_ms": str(outcome.engine_ms),
            "batch_size": str(outcome.batch_size),
            "batch_id": outcome.batch_id,
        }
        if outcome.error is not None:
            fields["error"] = dumps(outcome.error).decode()
            return self._finish(delivery, JobStatus.FAILED, fields)
        fields["outputs"] = dumps(outcome.output).decode()
        return self._finish(delivery, JobStatus.SUCCEEDED, fields)

    def _finish(self, delivery: Delivery, status: JobStatus, fields: dict[str, str]) -> Finish:
        return self.io.finish(delivery, status, fields)
