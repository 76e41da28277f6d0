"""On a real Valkey with the worker's own loop and the identity engine: an entry on a lane whose
payload is JSON but not an object, or whose `enq` is not finite, was decoded, then crashed the
loop's micro-batch (every time it was delivered, until dead-lettered), taking the other jobs
read with it along. No producer writes one (a hand-written or older entry can be): it is refused
as undecodable, acknowledged on its own, and the jobs read beside it run."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
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

KEYS = Keys("decode-refused:")
WORKER = "box-5-55"
CONFIG = ModelConfig(name="m", kind="batch", backend="identity", max_queue_delay_ms=0.0)
PARTITION = Partition.of(KEYS, CONFIG, "default")
BAD = {
    "a list payload": {"payload": b"[1, 2]", "enq": b"1"},
    "a string payload": {"payload": b'"inputs"', "enq": b"1"},
    "a nan enq": {"payload": b'{"inputs": {}}', "enq": b"nan"},
    "an infinite enq": {"payload": b'{"inputs": {}}', "enq": b"inf"},
}


@pytest.mark.parametrize("fields", BAD.values(), ids=list(BAD))
def test_decode_refuses_an_entry_no_producer_writes(fields: dict[bytes | str, bytes]) -> None:
    with pytest.raises(ValueError):
        RequestEntry.decode({b"id": b"odd", **{k.encode(): v for k, v in fields.items()}})


async def test_an_undecodable_entry_is_acknowledged_alone_and_its_batch_runs(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    stream = PARTITION.online

    async def queued(job_id: str) -> None:
        entry = RequestEntry(job_id, {"inputs": {"n": job_id}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "default"})

    await queued("before")
    for n, fields in enumerate(BAD.values()):
        await aredis.xadd(stream, {"id": f"odd-{n}", **fields})
    await queued("after")
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events)
    engine = IdentityEngine(CONFIG, "default", "")
    loop = MicroBatchLoop(
        PARTITION, LaneScheduler(PARTITION, reader, reclaimer), reader, writer, engine, 100
    )

    await loop.step()  # one micro-batch: all six entries
    await writer.close()

    for job_id in ("before", "after"):
        record = await store.get(job_id)
        assert record is not None and record.status == "succeeded"
    assert await aredis.xlen(stream) == 0  # every entry acknowledged and deleted
    assert (await aredis.xpending(stream, GROUP))["pending"] == 0
