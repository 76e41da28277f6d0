"""Variant statistics of jobs a worker fails without running them, on a real Valkey with the
worker's own loop and the identity engine: such a job carries the worker's read as `started`,
so it was sampled as run in about 0 ms, and an undecodable entry's queue wait was measured from
its entry's own stamp (here 1 ms after the epoch: a wait of 56 years in the variant's p99).
It is an error counted untimed, as an expired job is."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared.codec import dumps
from shared.job_store import JobStore
from shared.variant_stats import VariantStats, finished_samples
from tests.test_worker_writeback_undecodable import BAD, KEYS, STREAM, _loop, _queued


async def test_an_undecodable_entrys_failure_is_an_untimed_error(aredis: aioredis.Redis) -> None:
    await aredis.flushdb()
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _queued(store, "odd")
    [(entry_id, _)] = await aredis.xrange(STREAM)
    await aredis.xdel(STREAM, entry_id)  # its entry rewritten by hand, its `enq` 1 ms
    await aredis.xadd(STREAM, {"id": "odd", **BAD["a list payload"]})
    await _queued(store, "fine")
    loop, writer = await _loop(aredis)

    await loop.step()  # one micro-batch: both entries
    await writer.close()  # sends the statistics gathered

    stats = VariantStats(aredis, KEYS)
    window = (await stats.window("m", ["default"], time.time() - 60))["default"]
    assert (window.requests, window.errors) == (2, 1)
    assert [sample.ok for sample in window.samples] == [True]  # the job that ran, alone


def test_refused_parameters_are_an_untimed_error() -> None:
    """A generate job whose parameters the engine refuses fails at the worker's read: its
    fields as the generate loop writes them (`started` its read, `finished` a ms later)."""
    error = dumps({"type": "InvalidParameters", "message": "top_p must be in (0, 1]"}).decode()
    fields = {"model": "m", "variant": "v", "status": "failed", "error": error}
    stamps = {"created": "1000", "started": "1500", "finished": "1501"}
    [sample] = finished_samples([{**fields, **stamps}])[("m", "v")]
    assert (sample.ok, sample.timed) == (False, False)
