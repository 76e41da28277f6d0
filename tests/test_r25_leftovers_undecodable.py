"""On a real Valkey: an entry that cannot be read as a job but names one (an older producer's,
or a hand-written one) fails its job, which its client is told. Its `enq` stamp is as untrusted
as the rest of it: one of 1 told the client its job was created in 1970 (`total_ms` 56 years)
and stored a queue wait as long. The job's hash keeps the `created` its submit wrote, and the
failure claims no queue wait of its own."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry, loads
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r25-undecodable:")
WORKER = "box-2-25"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "default")
STREAM = PARTITION.online
REPLY = "r25-undecodable:reply:p1"


async def test_an_undecodable_entrys_stamp_is_not_its_jobs_creation(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    await store.create(RequestEntry("odd", {}, now_ms()), STREAM, {"model": "m", "variant": "d"})
    [(entry_id, _)] = await aredis.xrange(STREAM)
    await aredis.xdel(STREAM, entry_id)  # its entry as a hand-written one, stamped 1 ms past 1970
    await aredis.xadd(STREAM, {"id": "odd", "payload": b"[1]", "enq": b"1", "reply": REPLY})
    queued = await store.get("odd")
    assert queued is not None
    submitted = int(queued.fields["created"])
    reader = StreamReader(aredis, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, [delivery])] = await reader.wait([STREAM], 10, None)
    finish = PARTITION.skip_or_expire(delivery)
    assert finish is not None
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    pubsub = aredis.pubsub()
    try:
        await pubsub.ssubscribe(REPLY)
        assert [f.job_id for f in await writer.finish(STREAM, [finish])] == ["odd"]
        replied = None
        for _ in range(10):  # the subscription's confirmation, then the reply
            replied = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=1)
            if replied is not None:
                break
    finally:
        await pubsub.aclose()
        await writer.close()

    assert replied is not None
    [view] = loads(replied["data"])
    assert view["status"] == "failed" and view["error"]["type"] == "UndecodableEntry"
    # was 0.001: never a creation before the job was submitted
    assert view["timings"]["created"] >= submitted / 1000.0
    record = await store.get("odd")
    assert record is not None and record.fields["created"] == str(submitted)
    assert "queue_wait_ms" not in record.fields  # was 1.78e12: no wait is known
