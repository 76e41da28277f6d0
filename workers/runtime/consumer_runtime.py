"""Hosts the partition loops of one worker process on an asyncio loop in its own thread, so the
Celery worker's main thread stays free for Celery's own work (remote control, tasks, shutdown)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

import redis.asyncio as aioredis
import uvloop

from shared import job_scripts, token_scripts
from shared.heap_tuning import settle_heap
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository
from shared.redis_client import connect, preload
from shared.settings import Settings
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.base import BatchEngine, GenerateEngine
from workers.engines.registry import create_engine
from workers.generation.generate_loop import GenerateLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenWriter

log = logging.getLogger(__name__)
# Of the shutdown grace, what a generate engine's own shutdown needs after the drain.
ENGINE_CLOSE_S = 10.0


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class PartitionLoop(Protocol):
    stopping: asyncio.Event

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


class ConsumerRuntime:
    def __init__(self, settings: Settings, on_crash: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        # Called when serving ends on an error no loop handled: a worker whose consumer is gone
        # must exit (and be restarted), not idle on as a live process that reads nothing.
        self._on_crash = on_crash
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
        self._loops: list[MicroBatchLoop | GenerateLoop] = []
        self._engines: list[BatchEngine | GenerateEngine] = []

    def start(self, timeout: float = 600.0) -> None:
        """Load every engine and start serving; returns once all partitions are being read."""
        self._thread.start()
        self._ready.result(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._ready.done()

    def stop(self) -> None:
        """Warm shutdown: stop reading, finish the batch in hand, acknowledge, then return."""
        if not self._thread.is_alive():  # it crashed: its loop is closed, nothing is in hand
            return
        for partition_loop in self._loops:
            self.loop.call_soon_threadsafe(partition_loop.stopping.set)
        self._thread.join(timeout=self.settings.shutdown_grace_s)
        if self._thread.is_alive():
            log.error("consumer did not drain within %.0fs", self.settings.shutdown_grace_s)

    def _run_thread(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
                raise
            log.critical(
                "the consumer stopped on an unexpected error; the worker exits", exc_info=True
            )
            self._on_crash()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        client = connect(self.settings.redis_url, name=self.consumer)
        await preload(client, [*job_scripts.ALL, *token_scripts.ALL])
        events = JobEvents(self.settings.redis_url)
        writer = ResultWriter(client, self.keys, self.settings.result_ttl_s, events, self.consumer)
        for config, variant in self.partitions:
            partition = Partition.of(self.keys, config, variant)
            self._loops.append(await self._build_loop(client, writer, events, partition))
        settle_heap(self.settings)
        self._ready.set_result(None)
        log.info("serving %s as %s", [f"{c.name}:{v}" for c, v in self.partitions], self.consumer)
        try:
            await run_together(self._loops)
        except BaseException:
            self._on_crash()  # before the engines close: a hung engine's close never returns
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
        await reader.ensure_groups()
        ttl_s = self.settings.result_ttl_s
        reclaimer = Reclaimer(client, self.keys, partition, self.consumer, ttl_s, events)
        lanes = LaneScheduler(partition, reader, reclaimer)
        block_ms = self.settings.block_ms
        if isinstance(engine, GenerateEngine):
            tokens = TokenWriter(client, self.keys, ttl_s)
            drain_s = max(0.0, self.settings.shutdown_grace_s - ENGINE_CLOSE_S)
            return GenerateLoop(partition, lanes, reader, writer, tokens, engine, block_ms, drain_s)
        return MicroBatchLoop(partition, lanes, reader, writer, engine, block_ms)

    async def _load_engine(self, config: ModelConfig, variant: str) -> BatchEngine | GenerateEngine:
        engine = create_engine(config, variant, self.settings.artifact_dir)
        if isinstance(engine, GenerateEngine):
            # on this loop: the engine's output handler lives on the loop that serves it
            await engine.load()
            await engine.warmup()
        else:
            await asyncio.to_thread(engine.load)
            await asyncio.to_thread(engine.warmup)
        self._engines.append(engine)
        return engine
