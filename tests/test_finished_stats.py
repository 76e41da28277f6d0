"""A worker sends the variant statistics of the jobs it finishes once a second at most, not once
per micro-batch (`workers/partition/finished_stats.py`): nothing is lost, a second later or at
stop. On a real Valkey."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.keys import Keys
from shared.stats_window import BUCKET_S, window_span_s
from shared.variant_stats import VariantStats
from tests.conftest import until_async
from tests.lane_rig import abandoned_after, queue_jobs
from workers.partition.finished_stats import FinishedStats
from workers.partition.job_events import JobEvents
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("fs:")


def _finished(status: str, service_ms: int) -> dict[str, str]:
    created = int(time.time() * 1000)
    return {
        "model": "m",
        "variant": "a",
        "status": status,
        "created": str(created),
        "started": str(created + 2),
        "finished": str(created + 2 + service_ms),
    }


async def test_statistics_are_gathered_then_sent_a_moment_later_and_at_close(
    aredis: aioredis.Redis,
) -> None:
    stats = VariantStats(aredis, KEYS)
    since = time.time() - 60

    async def requests() -> int:
        return (await stats.window("m", ["a"], since))["a"].requests

    gathered = FinishedStats(stats, every_s=0.3)
    gathered.add([_finished("succeeded", 5), _finished("failed", 7)])
    gathered.add([_finished("succeeded", 9), _finished("cancelled", 1)])  # not counted
    assert await requests() == 0  # nothing sent per micro-batch

    async def all_three_sent() -> bool:
        return await requests() == 3

    await until_async(all_three_sent)
    window = (await stats.window("m", ["a"], since))["a"]
    assert window.errors == 1
    assert sorted(s.service_ms for s in window.samples) == [5.0, 7.0, 9.0]

    gathered.add([_finished("succeeded", 3)])
    await gathered.close()  # a stopping worker sends at once
    assert await requests() == 4


async def test_a_window_counts_over_its_whole_buckets(aredis: aioredis.Redis) -> None:
    """A window's buckets are whole, so it starts at the start of its first bucket: between 0
    and BUCKET_S before `since`, not always BUCKET_S (the console divided a minute's count by 70
    s, reading a steady rate up to a seventh low). Jobs counted in the current bucket are in a
    window that starts where `window_span_s` says."""
    now = time.time()
    since = now - 60.0
    span = window_span_s(since, now)
    assert span == pytest.approx(now - (since // BUCKET_S) * BUCKET_S)
    assert 60.0 <= span < 60.0 + BUCKET_S
    assert window_span_s(1_000_000.0, 1_000_060.0) == 60.0  # since on a bucket's start
    assert window_span_s(1_000_009.5, 1_000_069.5) == pytest.approx(69.5)
    stats = VariantStats(aredis, Keys("span:"))
    await stats.add_counts("m", "v", {"succeeded": 7.0})
    window = (await stats.window("m", ["v"], since, now))["v"]
    assert window.counters["succeeded"] == 7.0


async def test_an_expired_job_counts_as_an_error_without_a_latency(
    aredis: aioredis.Redis,
) -> None:
    """Expired jobs were not counted: a canary whose lane backed up showed 0 % errors and
    stepped on (or never saw `min_requests`). It never ran, so it gives no latency sample, as a
    dead letter gives none; a cancelled job is the client's choice and stays uncounted."""
    stats = VariantStats(aredis, Keys("expired:"))
    gathered = FinishedStats(stats)
    gathered.add([_finished("expired", 0), _finished("cancelled", 0)])
    await gathered.close()
    window = (await stats.window("m", ["a"], time.time() - 60))["a"]
    assert (window.requests, window.errors, window.samples) == (1, 1, [])


async def test_the_writer_marks_each_lanes_samples(aredis: aioredis.Redis) -> None:
    """A canary's p99 leaves out the bulk lane (`Sample.bulk`): the write-back is what tells
    the two lanes' results apart, from the stream it acknowledges them on."""
    keys = Keys("fs-lanes:")
    partition = abandoned_after(keys, 60)
    store = JobStore(aredis, keys, 60)
    await queue_jobs(store, partition.online, "on-1")
    await queue_jobs(store, partition.bulk, "bulk-1")
    reader = StreamReader(aredis, keys, partition.streams, "w-1")
    await reader.ensure_groups()
    writer = ResultWriter(aredis, keys, 60, JobEvents("redis://unused"), "w-1")
    for stream, got in await reader.wait(list(partition.streams), 10, 100):
        done = [partition.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"}) for d in got]
        assert len(await writer.finish(stream, done)) == 1
    await writer.close()
    window = await VariantStats(aredis, keys).window("m", ["default"], time.time() - 60)
    assert sorted(s.bulk for s in window["default"].samples) == [False, True]
