"""Hosts the partition loops of one worker process on an asyncio loop in its own thread, so the
Celery worker's main thread stays free for Celery's own work (remote control, tasks, shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, wait
from typing import Protocol

import redis.asyncio as aioredis
import uvloop

from shared import job_scripts, token_scripts
from shared.heap_tuning import settle_heap
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository
from shared.redis_client import connect, credentials_checked, preload
from shared.settings import Settings
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.base import BatchEngine, EngineDied, GenerateEngine
from workers.engines.cpu_budget import CPU_SHARES
from workers.engines.registry import create_engine
from workers.generation.generate_loop import GenerateLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.reclaim_turn import ReclaimTurn
from workers.partition.redis_backoff import until_done
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenWriter
from workers.runtime.memory_ceiling import MemoryCeiling

log = logging.getLogger(__name__)
# Of the shutdown grace, what a generate engine's own shutdown needs after the drain.
ENGINE_CLOSE_S = 10.0
# The least a worker waits for its engines: the longest startup probe in k8s/base (smollm2's,
# 120 x 5 s), which the worker's own wait must not cut short.
MIN_START_WAIT_S = 600.0
# How often a worker still loading its engines looks whether it was asked to stop.
START_SLICE_S = 0.5
# How often the runtime asks its generate engines whether they died (`EngineDeaths`).
ENGINE_CHECK_S = 1.0
# How long `/healthz` names a dead engine before `EngineDeaths` ends the worker: the probe, and
# whoever reads it, learns why the worker is about to exit, where an ended one answers "down".
DEATH_SHOWN_S = 2.0


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def start_wait_s(settings: Settings) -> float:
    """How long a worker waits for its engines: CONVEYOR_START_TIMEOUT_S, which is raised for a
    large LLM's load (`conveyor up` waits that long for the worker), or MIN_START_WAIT_S."""
    return max(settings.start_timeout_s, MIN_START_WAIT_S)


async def _through_outages(call: Callable[[], Awaitable[object]], what: str) -> None:
    """A start-up write of the worker's, waited out through an outage or a Redis refusing
    writes (its maxmemory, a failover) as the loops' are: the worker ended there, where Celery's
    consumer waits for the broker. A stop meanwhile cancels the start (`_stop_serving`); the
    wait is bounded by CONVEYOR_START_TIMEOUT_S. Refused credentials are no outage: they end
    the start at once."""

    async def checked() -> object:
        with credentials_checked():
            return await call()

    await until_done(checked, asyncio.Event(), what)


class EngineLoadError(RuntimeError):
    """An engine that failed to load, named with its cause in one line: the worker exits on it
    with that line, where the engine's own error named neither model nor variant."""

    def __init__(self, model: str, variant: str, cause: Exception) -> None:
        super().__init__(
            f"model {model!r}, variant {variant!r} failed to load: {type(cause).__name__}: {cause}"
        )


class PartitionLoop(Protocol):
    @property
    def stopping(self) -> asyncio.Event: ...  # read-only: a loop's may be a Stopping

    async def run(self) -> None: ...


async def run_together(loops: Sequence[PartitionLoop]) -> None:
    """Every partition's loop; the first that fails stops the others as a stop does (the work
    in hand finished and written back, or left pending), then its error is raised. They ran on
    while the engines were closed under them, and failed their jobs with the closed engines'
    errors, written back as results."""
    runs = [asyncio.create_task(partition_loop.run()) for partition_loop in loops]
    try:
        await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for partition_loop in loops:
            partition_loop.stopping.set()
        ended = await asyncio.gather(*runs, return_exceptions=True)
    for outcome in ended:
        if isinstance(outcome, BaseException):
            raise outcome


class EngineDeaths:
    """Runs beside the partition loops (`run_together`), stopped with them: asks each generate
    engine, on the loop that serves it, whether it died, for `/healthz` to read from its own
    thread. A partition loop asks only once a call of its own failed: an idle worker whose vLLM
    engine core was killed answered the liveness probe 200 for ever. Batch engines are not
    asked: their `dead()` probes the device (a warm-up call, a synchronize), meant for after a
    failed call. A death ends the worker, as the engine contract says (`EngineDied`): with no
    liveness probe (`conveyor up`, `conveyor autoscale`) an idle one lived on, its model served
    by no one until a job reached it and failed a call."""

    def __init__(self) -> None:
        self.loops: dict[str, GenerateLoop] = {}  # by partition name
        self.dead: tuple[str, ...] = ()  # the partitions whose engine died, at the last look
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        """Looks every ENGINE_CHECK_S; a death is shown on `/healthz` for DEATH_SHOWN_S, then
        handed to its partition's loop as a failed call's is: the loop logs it, gives up its
        generations at once, leaving their jobs pending, and raises EngineDied, which ends the
        worker (`run_together`). A stop's drain waited out a dead engine's generations that
        hung, never failing, and aborted them to no avail before the worker could exit."""
        while not self.stopping.is_set():
            self.dead = tuple(name for name, loop in self.loops.items() if loop.engine_dead())
            await self._pause(DEATH_SHOWN_S if self.dead else ENGINE_CHECK_S)
            if self.dead and not self.stopping.is_set():
                for name in self.dead:
                    self.loops[name].engine_died(EngineDied("found dead by the runtime's look"))
                return

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)


class ConsumerRuntime:
    def __init__(
        self,
        settings: Settings,
        on_crash: Callable[[], None] = lambda: None,
        on_recycle: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        # Called when serving ends on an error no loop handled: a worker whose consumer is gone
        # must exit (and be restarted), not idle on as a live process that reads nothing.
        self._on_crash = on_crash
        # Called when its memory passed CONVEYOR_WORKER_MAX_MEMORY_MB (`MemoryCeiling`): the
        # worker is to exit once drained, and be restarted.
        self._on_recycle = on_recycle
        self.keys = Keys(settings.key_prefix)
        self.repository = ModelRepository.load(settings.model_repository, settings.result_ttl_s)
        if not settings.models:  # a forgotten variable would leave a worker that serves nothing
            known = ", ".join(self.repository.models)
            raise ModelConfigError(
                "CONVEYOR_MODELS is empty: name what this worker serves, `model` or "
                f"`model:variant`, comma-separated (the repository has {known})"
            )
        self.partitions = self.repository.partitions(settings.models)
        self.consumer = consumer_name()
        # uvloop, like the producer's uvicorn: at one job per micro-batch the loop's own
        # polling and socket writes are most of a worker's CPU
        self.loop = uvloop.new_event_loop()
        # daemon: a consumer that cannot drain in the grace must not keep the process alive
        self._thread = threading.Thread(
            target=self._run_thread, name="conveyor-consumer", daemon=True
        )
        self._ready: Future[None] = Future()
        self._serving: asyncio.Task[None] | None = None
        self._loops: list[PartitionLoop] = []  # every partition's, EngineDeaths, a MemoryCeiling
        self._engines: list[BatchEngine | GenerateEngine] = []
        self._deaths = EngineDeaths()
        self._reclaim_turn = ReclaimTurn()  # every partition's: one reclaimed entry at a time
        self._crashed_on: BaseException | None = None  # the error `_crash` reported

    def start(self, check_stop: Callable[[], None] = lambda: None) -> None:
        """Load every engine and start serving; returns once all partitions are being read.
        `check_stop` runs every START_SLICE_S meanwhile and raises to give up (the worker's:
        Celery's `maybe_shutdown`, once SIGTERM asked for a stop; a long load held it off).
        Whatever ends the wait early, that, a failed load or one past `start_wait_s`, stops
        the runtime before it is raised: the engines loaded by then are closed."""
        self._thread.start()
        try:
            self._wait_ready(check_stop)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, check_stop: Callable[[], None]) -> None:
        wait_s = start_wait_s(self.settings)
        deadline = time.monotonic() + wait_s
        while not wait([self._ready], timeout=START_SLICE_S).done:
            check_stop()
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"not serving within {wait_s:g}s (CONVEYOR_START_TIMEOUT_S): its engines"
                    " still loading, or Redis unavailable (logged) all that time"
                )
        self._ready.result()  # the load's error, if it failed

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._ready.done()

    @property
    def dead_engines(self) -> tuple[str, ...]:
        """The partitions whose generate engine died, as last seen on the loop (every
        ENGINE_CHECK_S): any thread may read it, where an engine's `dead()` is its loop's."""
        return self._deaths.dead

    def stop(self) -> bool:
        """Warm shutdown: stop reading (or loading), finish the batch in hand, acknowledge,
        close the engines, then return. False when the consumer is still at it after the
        grace (an engine call that outlasts it): the jobs in hand stay pending, for a reclaim."""
        if not self._thread.is_alive():  # it crashed: its loop is closed, nothing is in hand
            return True
        with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: nothing to stop
            self.loop.call_soon_threadsafe(self._stop_serving)
        self._thread.join(timeout=self.settings.shutdown_grace_s)
        if self._thread.is_alive():
            log.error("consumer did not drain within %.0fs", self.settings.shutdown_grace_s)
            return False
        return True

    def _stop_serving(self) -> None:
        """On the loop, so it cannot race the end of the load: a load still running is
        cancelled (the engines loaded are closed), partition loops are told to stop."""
        if self._serving is not None and not self._ready.done():
            self._serving.cancel()
        for partition_loop in self._loops:
            partition_loop.stopping.set()

    def _recycle(self) -> None:
        """Past the memory ceiling: the loops stop reading now, finishing the work in hand
        (the stop a SIGTERM makes), and the worker is asked to exit once they have."""
        self._on_recycle()
        self._stop_serving()

    def _run_thread(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._serving = self.loop.create_task(self._serve())
        try:
            self.loop.run_until_complete(self._serving)
        except asyncio.CancelledError:
            log.info("engine load given up: the worker stops")  # only a stop cancels it
        except BaseException as exc:
            if not self._ready.done():  # the start raises it: a thread's traceback said it twice
                self._ready.set_exception(exc)
                return
            self._crash(exc)
        finally:
            self.loop.close()

    def _crash(self, error: BaseException) -> None:
        """Serving ended on `error`, that of the loops or, after them, of closing the engines:
        it is logged critically (unless a generate loop logged it, its engine's death), and the
        worker asked once to exit. The runtime said a death a second time, with a traceback,
        and asked twice."""
        if error is self._crashed_on:  # reported before the engines closed (`_serve`)
            return
        if not self._logged_death(error):
            log.critical(
                "the consumer stopped on an unexpected error; the worker exits", exc_info=error
            )
        if self._crashed_on is None:
            self._on_crash()
        self._crashed_on = error

    def _logged_death(self, error: BaseException) -> bool:
        """Whether `error` is a generate loop's EngineDied, raised from the death it logged."""
        return any(loop.raised_for_death(error) for loop in self._deaths.loops.values())

    async def _serve(self) -> None:
        client = connect(self.settings.redis_url, name=self.consumer)
        events = JobEvents(self.settings.redis_url)
        writer = ResultWriter(client, self.keys, self.settings.result_ttl_s, events, self.consumer)
        try:  # a load that fails or is given up closes the engines loaded before it too
            scripts = [*job_scripts.ALL, *token_scripts.ALL]
            await _through_outages(lambda: preload(client, scripts), "worker start: its scripts")
            # before any engine sizes its pool: each of this worker's gets its share of the CPUs
            CPU_SHARES.share_among_backends(c.backend_of(v) for c, v in self.partitions)
            for config, variant in self.partitions:
                partition = Partition.of(self.keys, config, variant)
                self._loops.append(await self._build_loop(client, writer, events, partition))
            if self._deaths.loops:
                self._loops.append(self._deaths)
            if max_mib := self.settings.worker_max_memory_mb:
                self._loops.append(MemoryCeiling(max_mib, self._recycle))
            settle_heap(self.settings)
            self._ready.set_result(None)
            served = [f"{c.name}:{v}" for c, v in self.partitions]
            log.info("serving %s as %s", served, self.consumer)
            try:
                await run_together(self._loops)
            except BaseException as exc:
                self._crash(exc)  # before the engines close: a hung engine's close never returns
                raise
        finally:
            for engine in self._engines:
                if isinstance(engine, GenerateEngine):
                    await engine.close()  # blocks the loop a few seconds; nothing else runs now
                else:
                    engine.close()
            await writer.close()
            await client.aclose()

    async def _build_loop(
        self, client: aioredis.Redis, writer: ResultWriter, events: JobEvents, partition: Partition
    ) -> MicroBatchLoop | GenerateLoop:
        engine = await self._load_engine(partition.config, partition.variant)
        generate = isinstance(engine, GenerateEngine)
        reader = StreamReader(client, self.keys, partition.streams, self.consumer, generate)
        await _through_outages(reader.ensure_groups, f"{partition.name}: its consumer groups")
        ttl_s = self.settings.result_ttl_s
        reclaimer = Reclaimer(client, self.keys, partition, self.consumer, ttl_s, events)
        lanes = LaneScheduler(partition, reader, reclaimer, self._reclaim_turn)
        block_ms = self.settings.block_ms
        if isinstance(engine, GenerateEngine):
            tokens = TokenWriter(client, self.keys, ttl_s)
            drain_s = max(0.0, self.settings.shutdown_grace_s - ENGINE_CLOSE_S)
            generate_loop = GenerateLoop(
                partition, lanes, reader, writer, tokens, engine, block_ms, drain_s
            )
            self._deaths.loops[partition.name] = generate_loop
            return generate_loop
        return MicroBatchLoop(partition, lanes, reader, writer, engine, block_ms)

    async def _load_engine(self, config: ModelConfig, variant: str) -> BatchEngine | GenerateEngine:
        try:
            engine = create_engine(config, variant, self.settings.artifact_dir)
            if isinstance(engine, GenerateEngine):
                # on this loop: the engine's output handler lives on the loop that serves it
                await engine.load()
                await engine.warmup()
            else:
                await asyncio.to_thread(engine.load)
                await asyncio.to_thread(engine.warmup)
        except Exception as exc:
            raise EngineLoadError(config.name, variant, exc) from exc
        self._engines.append(engine)
        return engine
