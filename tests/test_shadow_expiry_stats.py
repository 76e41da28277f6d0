"""Shadow copies that expire in their bulk lane are no failures of the shadow variant, on a real
Valkey without a stack: copies made as the producer makes them, expired by a worker's own read
and write-back, its statistics sent, and the experiments report built from them. A copy keeps
its primary's deadline and waits behind online work by design; counted as an error, it made
the experiments' success-rate test call the shadow "significantly lower", which says nothing of
the variant. A client's own job that expires there still counts."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from producer_api.experiments.serving import compared
from producer_api.routes.shadowing import ShadowCopies
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import QueueLimits
from shared.shadow_pairs import ShadowPairs
from shared.variant_stats import VariantStats
from tests.test_shadow_copies import CONFIG as SHADOWED
from tests.test_shadow_copies import ROUTES
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("shadow-expiry:")
CONFIG = SHADOWED.model_copy(update={"queue": QueueLimits()})  # room for every copy
MIRROR = Partition.of(KEYS, CONFIG, "mirror")


async def _late_jobs(store: JobStore, copies: ShadowCopies) -> None:
    """Three online requests whose deadline passes before the mirror's worker reads their
    copies, and one client job of the mirror's own, in its bulk lane, as late."""
    deadline = now_ms() - 1
    for n in range(3):
        entry = RequestEntry(new_job_id("m", "stable"), {"inputs": {"n": n}}, now_ms(), deadline)
        stable = {"model": "m", "variant": "stable", "deadline": deadline}
        await store.create(entry, KEYS.queue("m", "stable"), stable)
        copies.copy(CONFIG, ROUTES, entry, "stable")
    await copies.stop()  # the copies are made in the background
    own = RequestEntry(new_job_id("m", "mirror"), {"inputs": {}}, now_ms(), deadline)
    await store.create(own, MIRROR.bulk, {"model": "m", "variant": "mirror", "deadline": deadline})


async def _expired_by_the_mirrors_worker(client: aioredis.Redis) -> None:
    """The mirror's worker reads its bulk lane, expires every late entry, writes them back and
    sends its statistics."""
    reader = StreamReader(client, KEYS, MIRROR.streams, "mirror-worker")
    await reader.ensure_groups()
    writer = ResultWriter(client, KEYS, 60, JobEvents("redis://unused"), "mirror-worker")
    for stream, deliveries in await reader.wait([MIRROR.bulk], 100, None):
        finishes = [MIRROR.skip_or_expire(delivery) for delivery in deliveries]
        assert all(f is not None and f.status == "expired" for f in finishes), finishes
        written = await writer.finish(stream, [f for f in finishes if f is not None])
        assert len(written) == 4
    await writer.close()


async def test_expired_shadow_copies_are_no_failures_of_the_shadow(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    copies = ShadowCopies(store, ShadowPairs(aredis, KEYS, ttl_s=60), KEYS)
    await _late_jobs(store, copies)
    assert await aredis.xlen(MIRROR.bulk) == 4

    await _expired_by_the_mirrors_worker(aredis)

    windows = await VariantStats(aredis, KEYS).window("m", CONFIG.variants, time.time() - 60)
    report = {row["variant"]: row for row in compared(windows, "stable", ROUTES)}
    mirror = report["mirror"]
    assert (mirror["role"], mirror["requests"], mirror["failed"]) == ("shadow", 1, 1), mirror
