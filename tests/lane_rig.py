"""What the tests of a worker's read path set up on a real Valkey: a partition whose entries are
abandoned after a short visibility timeout, jobs queued in a lane, and a generate loop with no
worker process around it."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.conftest import until_async
from workers.engines.base import GenerateEngine
from workers.generation.generate_loop import GenerateLoop
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader
from workers.partition.token_writer import TokenWriter


async def until_blocked_in_read(client: aioredis.Redis) -> None:
    """Wait until a connection of the server blocks in XREADGROUP: a worker's read, parked."""

    async def blocked() -> bool:
        clients = await client.client_list()
        return any(c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in clients)

    await until_async(blocked)


def abandoned_after(keys: Keys, visibility_timeout_s: float, model: str = "m") -> Partition:
    """Partition `<model>:default` (an identity model) whose entries a reclaimer takes over
    once idle for `visibility_timeout_s`."""
    queue = QueueLimits(visibility_timeout_s=visibility_timeout_s)
    config = ModelConfig(name=model, kind="batch", backend="identity", queue=queue)
    return Partition.of(keys, config, "default")


async def queue_jobs(store: JobStore, stream: str, *job_ids: str) -> None:
    """Jobs with empty inputs, queued in lane `stream` in this order."""
    for job_id in job_ids:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "default"})


def generate_loop(
    aredis: aioredis.Redis,
    keys: Keys,
    partition: Partition,
    reader: StreamReader,
    engine: GenerateEngine,
    drain_s: float = 1,
    block_ms: int = 50,
) -> GenerateLoop:
    """A generate loop of consumer `reader.consumer` on `engine` (loaded), serving `partition`,
    that gives its generations `drain_s` at a stop and blocks its reads up to `block_ms`;
    webhooks go nowhere (no broker)."""
    events = JobEvents("redis://unused")
    worker = reader.consumer
    return GenerateLoop(
        partition,
        LaneScheduler(partition, reader, Reclaimer(aredis, keys, partition, worker, 60, events)),
        reader,
        ResultWriter(aredis, keys, 60, events, worker),
        TokenWriter(aredis, keys, 60),
        engine,
        block_ms=block_ms,
        drain_s=drain_s,
    )
