"""A real engine for fault tests (loaded as the custom backend `tests.fault_engine:FaultEngine`):
returns its inputs, but an item can make the batch raise, make the process die mid-batch, call
`sys.exit` (as a library may), get an output JSON cannot hold, poison the engine for good (as a
CUDA error does, while the file an item names in `while` exists), keep `hold_mb` MiB for good
(as a leaking library does), or the batch can take time, so the tests inject faults through
ordinary job inputs. Also the rigs fault tests share: a staged engine's micro-batch loop
(`staged_loop`), and a client whose Redis calls lose a cancel (`cancel_losing_client`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.codec import dumps
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.redis_client import HiredisConnection, RedisClient, connect
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.base import BatchEngine, StagedBatchEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

FIXED_ENV = "CONVEYOR_TEST_POISON_FIXED"
# An item's `output`: an engine's output that no job can store (the engine returns it as is).
ODD_OUTPUTS: dict[str, Any] = {
    "bytes": {"b": b"\x00\xff"},
    "set": {"s": {1}},
    "text": "plain",
    "nan": {"scores": [0.5, math.nan]},
    "inf": {"logits": {"top": -math.inf}},
    "nan-array": {"embeddings": np.array([[0.25, 0.5], [np.nan, 1.0]], dtype=np.float32)},
}


class FaultEngine(BatchEngine):
    inline = False

    def load(self) -> None:
        self.fixed = os.environ.get(FIXED_ENV) == "1"
        # A variant's `fail_percent` fails that share of distinct inputs, the same ones every
        # time (a hash of the item), so a flaky canary fails at a known rate.
        self.fail_percent = float(self.parameters.get("fail_percent", 0))
        self._dead = False
        self._running = threading.Lock()
        self._held: list[bytes] = []  # what items' `hold_mb` leaked, every page touched

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._running:
            return self._infer(inputs)

    def close(self) -> None:
        """Waits for the call in flight, as freeing a device's memory waits for its work."""
        with self._running:
            pass

    def _infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        actions = {item.get("action") for item in inputs}
        if "crash" in actions and not self.fixed:
            os._exit(3)
        if "exit" in actions:
            sys.exit(5)  # SystemExit: no Exception, so nothing on the way catches it
        if "no-list" in actions:
            return None  # type: ignore[return-value]
        if self._dead or any(_flagged(item.get("while")) for item in inputs):
            self._dead = True  # as a CUDA error that poisoned the device: nothing runs after it
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if "raise" in actions:
            tags = [item.get("tag") for item in inputs if item.get("action") == "raise"]
            raise ValueError(f"poison item {tags}")
        if unlucky := [item for item in inputs if self._fails(item)]:
            raise RuntimeError(f"injected failure on {len(unlucky)} items")
        self._held.extend(b"\x01" * (int(item.get("hold_mb", 0)) << 20) for item in inputs)
        time.sleep(max((item.get("sleep_ms", 0) for item in inputs), default=0) / 1000)
        return [
            ODD_OUTPUTS.get(item.get("output"), {**item, "pid": os.getpid()}) for item in inputs
        ]

    def dead(self) -> bool:
        return self._dead

    def _fails(self, item: dict[str, Any]) -> bool:
        if not self.fail_percent:
            return False
        digest = hashlib.blake2b(dumps(item), digest_size=8).digest()
        return int.from_bytes(digest, "big") % 10_000 < self.fail_percent * 100


def _flagged(path: Any) -> bool:
    return isinstance(path, str) and Path(path).is_file()


class StagedFaultEngine(FaultEngine, StagedBatchEngine):
    """The same faults through a staged engine's three stages: the device stage runs them."""

    def prepare(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs

    def run(self, prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return FaultEngine.infer(self, prepared)

    def finish(self, running: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return running


async def staged_loop(
    client: RedisClient,
    keys: Keys,
    config: ModelConfig,
    worker: str,
    reader: type[StreamReader] = StreamReader,
    writer: type[ResultWriter] = ResultWriter,
    reader_client: RedisClient | None = None,
) -> MicroBatchLoop:
    """The micro-batch loop of `config`'s default variant on a loaded StagedFaultEngine, as
    `worker` (its consumer group made): reading through a `reader` on `reader_client` (else
    `client`), writing back through a `writer`, a read blocking 100 ms."""
    partition = Partition.of(keys, config, "default")
    lanes_reader = reader(reader_client or client, keys, partition.streams, worker)
    await lanes_reader.ensure_groups()
    events = JobEvents("redis://unused")
    reclaimer = Reclaimer(client, keys, partition, worker, 60, events)
    engine = StagedFaultEngine(config, "default", "")
    engine.load()
    lanes = LaneScheduler(partition, lanes_reader, reclaimer)
    results = writer(client, keys, 60, events, worker)
    return MicroBatchLoop(partition, lanes, lanes_reader, results, engine, 100)


class LosesCancels(HiredisConnection):
    """A connection whose read, cancelled, raises a Redis timeout in the cancel's place: the
    cancel a Redis call can lose (shared/redis_client.py, `_KeepsCancel`), every time."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except asyncio.CancelledError:
            raise RedisTimeoutError("Timeout reading from the server") from None


class SwallowsCancels(HiredisConnection):
    """A connection whose read, cancelled, answers nil as if the server had: a cancel swallowed
    whole (a retry of the error it was lost as that succeeded, a `wait_for` that dropped it)."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except asyncio.CancelledError:
            await self.disconnect(nowait=True)  # its reply unread: the connection is spent
            return None


@contextlib.asynccontextmanager
async def cancel_losing_client(
    url: str, losing: type[HiredisConnection] = LosesCancels
) -> AsyncIterator[RedisClient]:
    """A client of `url` as a process makes one (`connect`), on connections that lose a cancel
    (`losing`: as an error, or whole); its reads may block up to a minute. Closed on the way
    out."""
    client = connect(url, max_connections=4, blocks_ms=60_000)
    client.connection_pool.connection_class = losing
    try:
        yield client
    finally:
        await client.aclose()


# Each way a connection loses a cancel, and what the error raised in its place is (none: whole)
LOSING = pytest.mark.parametrize(
    ("losing", "cause"),
    [(LosesCancels, RedisTimeoutError), (SwallowsCancels, type(None))],
    ids=["as-a-timeout", "whole"],
)


async def raised_by(call: Awaitable[object]) -> BaseException | None:
    """What `call` raised, as the code around it sees it (None: it returned)."""
    try:
        await call
    except BaseException as exc:
        return exc
    return None
