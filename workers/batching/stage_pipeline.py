"""Overlaps host and device work of a staged engine across micro-batches: while the device runs
micro-batch n, the host tokenises and pads n+1 (`prepare`, on a thread pool sized by the
engine's `host_threads`) and encodes the results of n (`finish`), so the tokenizer is off the
device's critical path. Each micro-batch is still one engine call with one outcome per job and
one write-back; a micro-batch that fails in any stage is rerun through `execute`, which bisects
it so only the bad input fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from workers.batching.device_schedule import DeviceSchedule
from workers.batching.micro_batch_executor import (
    EngineStart,
    Outcome,
    engine_call,
    engine_inputs,
    execute,
    one_per_input,
    succeeded,
)
from workers.batching.micro_batch_telemetry import stage_span
from workers.engines.base import StagedBatchEngine

T = TypeVar("T")
Done = Callable[[list[Outcome]], Awaitable[None]]


class Watch(Protocol):
    """A micro-batch's watch (`LongRun`): its run bounded from `started`, its entries kept
    claimed until `end`."""

    def started(self) -> None: ...

    def end(self) -> None: ...


# Micro-batches past `prepare` at once: one on the device, one finishing and writing back.
DEPTH = 2


class StagePipeline:
    def __init__(self, engine: StagedBatchEngine, depth: int = DEPTH) -> None:
        self.engine = engine
        self.host = ThreadPoolExecutor(engine.host_threads, thread_name_prefix="engine-host")
        # One thread: device work is queued in submission order, as the engine requires.
        self.device = ThreadPoolExecutor(1, thread_name_prefix="engine-device")
        self.slots = asyncio.Semaphore(depth)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.failures: list[BaseException] = []
        self.schedule = DeviceSchedule()

    async def until_wanted(self) -> None:
        """Wait until the device is about to want another micro-batch: the caller reads it
        then, not as soon as the last one is queued (see `DeviceSchedule`). What a micro-batch
        raised in the background (an engine that died) is raised here first: raised at the
        next submit only, it waited for traffic, its entries held by no one running them. Asked
        again after the wait, which the failure itself may end: else the loop read one more
        micro-batch for the dead engine, left pending under a consumer about to exit."""
        self.raise_failure()
        await self.schedule.until_wanted()
        self.raise_failure()

    async def submit(
        self, inputs: list[dict[str, Any]], done: Done, watch: Watch | None = None
    ) -> None:
        """Returns once `inputs` is prepared and queued, so the caller reads the next
        micro-batch while this one runs; `done` gets its outcomes (job order) when it ends.
        `watch`, if given, is started once it holds a slot (the wait for one is a wait for
        earlier micro-batches' write-backs, Redis refusing writes, which no engine time limit
        counts), and ended where the micro-batch fails before `done` has it."""
        await self._take_slot()
        if watch is not None:
            watch.started()
        try:
            prepared: Any = await self._on(self.host, self.engine.prepare, engine_inputs(inputs))
        except Exception:
            prepared = None  # bad input somewhere: `execute` bisects to the culprit
        self.schedule.given()
        task = asyncio.create_task(self._complete(inputs, prepared, done, watch))
        self.in_flight.add(task)
        task.add_done_callback(self._forget)

    async def _take_slot(self) -> None:
        """A slot is freed by a micro-batch that failed too (an engine that died, a write-back
        a stop ended with Redis still refusing it): what it raised is raised once the slot is
        taken, the slot given back. Run all the same, this micro-batch met the dead engine, or
        ran past the stop only to have its results refused, its jobs run again elsewhere."""
        self.raise_failure()
        await self.slots.acquire()
        if self.failures:
            self.slots.release()
            self.raise_failure()

    async def _complete(
        self, inputs: list[dict[str, Any]], prepared: Any, done: Done, watch: Watch | None
    ) -> None:
        """What a stage or the write-back raises is kept for the loop (`raise_failure`), before
        the schedule is told: its wake-up may be the loop's cue to read (`until_wanted`). A
        micro-batch that failed before its write-back has its watch ended, its entries left
        pending untouched: watched on, they were re-claimed for as long as the worker lived, and
        its `max_run_s` ran out later, cutting short another's write-back."""
        outcomes: list[Outcome] | None = None
        try:
            with stage_span("engine"):  # a child of the micro-batch's span: its context's
                outcomes = await self._outcomes(inputs, prepared)
            self.schedule.done(_device_s(outcomes))
            await done(outcomes)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.failures.append(exc)
            if outcomes is None:
                self.schedule.done(None)
                if watch is not None:
                    watch.end()
            raise
        finally:
            self.slots.release()

    async def _outcomes(self, inputs: list[dict[str, Any]], prepared: Any) -> list[Outcome]:
        """A micro-batch that failed a stage is rerun bisected on the device thread: on another
        thread its `run` calls overlapped the next micro-batch's, which the engine's contract
        rules out (its static buffers would mix the two's inputs)."""
        if prepared is None:
            return await execute(self.engine, inputs, self.device)
        try:
            start, running = await self._on(self.device, self._run, prepared)
            outputs = one_per_input(inputs, await self._on(self.host, self.engine.finish, running))
        except Exception:
            return await execute(self.engine, inputs, self.device)
        return succeeded(inputs, outputs, start)

    def _run(self, prepared: Any) -> tuple[EngineStart, Any]:
        """The device stage, stamped when the device takes it up: until then its jobs wait."""
        start = EngineStart.now()
        return start, self.engine.run(prepared)

    async def _on(self, pool: ThreadPoolExecutor, stage: Callable[[Any], T], arg: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, engine_call, stage, arg)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # kept in `failures` already; retrieved, asyncio logs it no more

    def raise_failure(self) -> None:
        """Re-raise, in the loop, what a micro-batch's write-back raised in the background."""
        if self.failures:
            raise self.failures.pop(0)

    async def drain(self) -> None:
        """Wait until every submitted micro-batch has ended and been handed to `done`."""
        while self.in_flight:
            await asyncio.wait(set(self.in_flight))
        self.raise_failure()

    def close(self) -> None:
        self.host.shutdown(wait=True)
        self.device.shutdown(wait=True)


def _device_s(outcomes: list[Outcome]) -> float:
    """A micro-batch's time on the device: each engine call's once, summed (a micro-batch that
    failed is rerun bisected, a call per part)."""
    return sum({o.batch_id: o.engine_ms for o in outcomes}.values()) / 1000.0
