"""What a job costs Valkey at enqueue: its stream entry leaves out the fields it would hold at
their defaults (no deadline, no trace), and ENQUEUE writes the hash's lane (`stream`) from the
key it is called on rather than from an argument naming it again. Each such pair went through
the producer's call, the script's arguments, the server's commands and the append-only file
for every job. What every release reads is unchanged: `RequestEntry.decode` has read a missing
`deadline` or `tp` as none since the first release, and the hash holds `stream` as before."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys

KEYS = Keys("valkey-cost:")
STREAM = KEYS.queue("m", "v")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _enqueued(aredis: aioredis.Redis, entry: RequestEntry) -> tuple[dict[bytes, bytes], ...]:
    """The job's stream entry and hash as ENQUEUE wrote them."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await store.create(entry, STREAM, {"model": "m", "variant": "v"})
    entries = await aredis.xrange(STREAM)
    (fields,) = [f for _, f in entries if f[b"id"] == entry.job_id.encode()]
    return fields, await aredis.hgetall(KEYS.job(entry.job_id))


async def test_an_untraced_job_without_a_deadline_writes_neither_to_its_entry(
    aredis: aioredis.Redis,
) -> None:
    entry = RequestEntry("plain", {"inputs": {"x": 1}}, now_ms(), reply="r")
    fields, job = await _enqueued(aredis, entry)
    assert b"tp" not in fields and b"deadline" not in fields, fields
    # read as every release reads an entry: no deadline, no trace, as before
    read = RequestEntry.decode(fields)
    assert (read.deadline_ms, read.traceparent, read.tenant) == (0, "", "default")
    assert (read.job_id, read.payload, read.reply) == ("plain", {"inputs": {"x": 1}}, "r")
    assert job[b"stream"] == STREAM.encode() and job[b"status"] == b"queued"


async def test_a_traced_job_with_a_deadline_carries_both(aredis: aioredis.Redis) -> None:
    deadline = now_ms() + 60_000
    entry = RequestEntry("traced", {"inputs": {}}, now_ms(), deadline, traceparent=TRACEPARENT)
    fields, _ = await _enqueued(aredis, entry)
    read = RequestEntry.decode(fields)
    assert (read.deadline_ms, read.traceparent) == (deadline, TRACEPARENT)


def test_an_older_producers_entry_reads_as_a_newer_ones() -> None:
    """A rolling upgrade: an entry that names its defaults (an older producer's) and one that
    leaves them out are the same job to a worker of either release."""
    entry = RequestEntry("j", {"inputs": {}}, 1.5, reply="r")
    written = entry.encode().items()
    lean = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in written}
    older = {**lean, b"deadline": b"0", b"tp": b""}
    assert RequestEntry.decode(older) == RequestEntry.decode(lean)


def test_the_enqueue_call_names_the_lane_once(aredis: aioredis.Redis) -> None:
    """The lane is ENQUEUE's first key; the hash's `stream` pair is no longer sent beside it."""
    entry = RequestEntry("once", {"inputs": {}}, 1.5, reply="r")
    keys, args = JobStore(aredis, KEYS, 60).enqueue_call(NewJob(entry, STREAM, {}), 0)
    assert keys[0] == STREAM
    assert "stream" not in args and STREAM not in args, args
