"""On a real Valkey with the worker's own loop and the identity engine: an entry that cannot be
read as a job but names one (its `id` readable: an older producer's, or a hand-written one) was
only acknowledged, and its job stayed `queued` until its TTL, polled by a client for a job no
worker would ever run. Its job fails saying why, and the jobs read beside it run."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("writeback-undecodable:")
WORKER = "box-8-88"
CONFIG = ModelConfig(name="m", kind="batch", backend="identity", max_queue_delay_ms=0.0)
PARTITION = Partition.of(KEYS, CONFIG, "default")
STREAM = PARTITION.online
BAD = {
    "a list payload": {"payload": b"[1, 2]", "enq": b"1"},
    "a nan enq": {"payload": b'{"inputs": {}}', "enq": b"nan"},
}


async def _queued(store: JobStore, job_id: str) -> None:
    entry = RequestEntry(job_id, {"inputs": {"n": job_id}}, now_ms())
    await store.create(entry, STREAM, {"model": "m", "variant": "default"})


async def _loop(client: aioredis.Redis) -> tuple[MicroBatchLoop, ResultWriter]:
    reader = StreamReader(client, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(client, KEYS, 60, events, WORKER)
    reclaimer = Reclaimer(client, KEYS, PARTITION, WORKER, 60, events)
    engine = IdentityEngine(CONFIG, "default", "")
    lanes = LaneScheduler(PARTITION, reader, reclaimer)
    return MicroBatchLoop(PARTITION, lanes, reader, writer, engine, 100), writer


@pytest.mark.parametrize("fields", BAD.values(), ids=list(BAD))
async def test_a_job_whose_entry_cannot_be_read_fails_saying_why(
    aredis: aioredis.Redis, fields: dict[str, bytes]
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _queued(store, "odd")
    [(entry_id, _)] = await aredis.xrange(STREAM)
    await aredis.xdel(STREAM, entry_id)  # its entry as an older producer wrote it, say
    await aredis.xadd(STREAM, {"id": "odd", **fields})
    await _queued(store, "fine")
    loop, writer = await _loop(aredis)

    await loop.step()  # one micro-batch: both entries
    await writer.close()

    odd, fine = await store.get("odd"), await store.get("fine")
    assert odd is not None and odd.status == JobStatus.FAILED  # was: queued until its TTL
    assert loads(odd.fields["error"])["type"] == "UndecodableEntry"
    assert fine is not None and fine.status == JobStatus.SUCCEEDED
    assert (await aredis.xpending(STREAM, GROUP))["pending"] == 0
