"""What the console reads per look stays bounded without leaving anything out, on a real Valkey:
the live summary refreshes MAX_BATCHES running batches a second, in turn, and shows all of them
(it showed the 20 expiring first, so one tenant's batch beside another's 20 was never shown);
the job list reads at most READ_LIMIT job hashes however many partitions there are (it read
100 per source: 30,000 with 60 partitions); a viewer is sent at most BATCHES_SHOWN batches a
second, its own tenant's among them (every viewer was sent every running batch)."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from producer_api.app import build_state
from producer_api.auth import ANONYMOUS, Principal
from producer_api.console.api_router import BATCHES_SHOWN, summary_for
from producer_api.console.job_browser import READ_LIMIT, JobFilter, recent_jobs
from producer_api.console.route_board import route_board
from producer_api.console.session import ConsoleSession
from producer_api.console.summaries import MAX_BATCHES, ConsoleSummaries
from producer_api.state import ProducerState
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, Variant
from shared.settings import Settings
from shared.variant_stats import Sample
from tests.test_canary_rules_unit import _WindowsAsked

KEYS = Keys("bounds:")
HOUR_MS = 3_600_000


@pytest.fixture
async def state(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[ProducerState]:
    """The producer's services on a clean keyspace (`aredis` flushed it), no loop started."""
    built = build_state(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled"))
    yield built
    await built.redis.aclose()


async def _running_batch(state: ProducerState, tenant: str, items: int, expires_ms: int) -> str:
    """A running batch of `items` queued items, recorded as the Batch API records one."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    store, ttl_s = state.batch_store, 600
    open_list = KEYS.batch_open(batch_id, "identity", "default")
    ids = [new_job_id("identity", "default") for _ in range(items)]
    await store.create(batch_id, {"tenant": tenant, "total": items}, ttl_s)
    fields = {"model": "identity", "variant": "default", "batch": batch_id}
    stream = KEYS.bulk_queue("identity", "default")
    jobs = [NewJob(RequestEntry(i, {"inputs": {}}, now_ms()), stream, fields) for i in ids]
    assert await state.job_store.create_many(jobs) == []
    await store.add_items(batch_id, [(job_id, open_list) for job_id in ids], [], ttl_s)
    await store.start(batch_id, [open_list], items, {"invalid": 0}, expires_ms)
    return batch_id


async def _shown(summaries: ConsoleSummaries) -> dict[str, dict[str, int]]:
    """The counts of every batch the next summary shows, by batch id."""
    await summaries.step()
    return {body["id"]: body["counts"] for body in summaries.snapshot["batches"]}


async def test_every_running_batch_is_shown_and_refreshed_in_turn(state: ProducerState) -> None:
    many = MAX_BATCHES + 4
    expires = now_ms() + HOUR_MS
    crowd = [await _running_batch(state, "acme", 1, expires + n) for n in range(many)]
    # expiring last: sorted after the crowd in the active index
    lone = await _running_batch(state, "solo", 2, expires + HOUR_MS)
    summaries = ConsoleSummaries(state)
    turn = math.ceil((many + 1) / MAX_BATCHES)  # looks until each was refreshed once
    for _ in range(turn):
        shown = await _shown(summaries)
    assert set(shown) == {*crowd, lone}
    assert shown[lone]["cancelled"] == 0

    items = await state.redis.lrange(KEYS.batch_items(lone), 0, 0)
    await state.job_store.settle_many([items[0].decode()], JobStatus.CANCELLED, {})
    for _ in range(turn):  # the lone batch's turn comes round again
        shown = await _shown(summaries)
    assert shown[lone]["cancelled"] == 1  # its progress, not the state it was first shown in
    assert set(shown) == {*crowd, lone}


async def test_a_viewer_is_sent_the_newest_batches_it_may_see_and_how_many_there_are(
    state: ProducerState,
) -> None:
    expires = now_ms() + HOUR_MS
    lone = await _running_batch(state, "solo", 1, expires)
    for n in range(BATCHES_SHOWN + 4):
        await _running_batch(state, "acme", 1, expires + n)
    summaries = ConsoleSummaries(state)
    for _ in range(math.ceil((BATCHES_SHOWN + 5) / MAX_BATCHES)):
        await summaries.step()
    assert len(summaries.snapshot["batches"]) == BATCHES_SHOWN + 5  # held, not sent
    admin = summary_for(summaries.snapshot, ConsoleSession(ANONYMOUS, "csrf"))
    assert len(admin["batches"]) == BATCHES_SHOWN and admin["batches_total"] == BATCHES_SHOWN + 5
    solo = Principal("solo", frozenset({"read"}), frozenset(), "solo-key", None)
    own = summary_for(summaries.snapshot, ConsoleSession(solo, "csrf", "nonce"))
    assert [b["id"] for b in own["batches"]] == [lone] and own["batches_total"] == 1


async def test_a_job_list_reads_at_most_read_limit_job_hashes(aredis: aioredis.Redis) -> None:
    models = [f"m{n}" for n in range(60)]
    repository = ModelRepository(
        {m: ModelConfig(name=m, kind="batch", backend="identity") for m in models}
    )
    async with aredis.pipeline(transaction=False) as pipe:
        for model in models:
            for _ in range(120):  # more than a page shows, in every partition
                entry = RequestEntry(new_job_id(model, "default"), {"inputs": {}}, now_ms())
                pipe.xadd(KEYS.queue(model, "default"), entry.encode())  # type: ignore[arg-type]
        await pipe.execute()
    before = await _hash_reads(aredis)
    await recent_jobs(aredis, KEYS, repository, JobFilter())
    assert await _hash_reads(aredis) - before <= READ_LIMIT


async def _hash_reads(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


async def test_the_route_board_reads_no_latency_samples(
    state: ProducerState, aredis: aioredis.Redis
) -> None:
    """The Routes page read each shadow's last hour with its latency samples (up to
    WINDOW_SAMPLES rows decoded per shadow per view) and showed only its comparison counters."""
    variants = {"stable": Variant(), "mirror": Variant(weight=0, shadow=True, sample_rate=0.5)}
    config = ModelConfig(
        name="m", kind="batch", backend="identity", default_variant="stable", variants=variants
    )
    stats = _WindowsAsked(aredis, KEYS)
    await stats.record_samples({("m", "mirror"): [Sample(True, 1.0, 2.0)] * 3})
    await stats.add_counts_once("m", "mirror", {"shadow_pairs": 2, "shadow_agree": 1}, "p", 60)
    state.traffic.repository, state.traffic.stats = ModelRepository({"m": config}), stats

    (row,) = await route_board(state.traffic, lambda model: True)

    shown = [(s["variant"], s["rate"], s["compared"]["pairs"]) for s in row.shadows]
    assert shown == [("mirror", 0.5, 2)]
    assert stats.asked == [("mirror", False)]
