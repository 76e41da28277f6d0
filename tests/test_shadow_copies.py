"""Shadow copies on a real Valkey, without a stack: a sampled online request is copied to its
shadow's bulk lane and the pair is kept for comparison; a full shadow lane drops the copy (it is
counted as dropped, and nothing half-written stays behind), and the client's job is untouched.
The stack's side (the copy runs, is compared, never reaches the client) is
`tests/test_routes.py`."""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from producer_api.routes.shadowing import SHADOW_TENANT, ShadowCopies
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, QueueLimits, Variant
from shared.routing import Routes
from shared.shadow_pairs import ShadowPairs

KEYS = Keys("shadow:")
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    default_variant="stable",
    variants={"stable": Variant(), "mirror": Variant(weight=0, shadow=True)},
    queue=QueueLimits(max_length=2),
)
ROUTES = Routes(weights={"stable": 100.0}, shadows={"mirror": 1.0})
MIRROR = KEYS.bulk_queue("m", "mirror")


def _copies(outcome: str) -> float:
    labels = {"model": "m", "variant": "mirror", "outcome": outcome}
    return REGISTRY.get_sample_value("conveyor_shadow_copies_total", labels) or 0.0


async def _online(store: JobStore, text: str) -> RequestEntry:
    """An accepted online request of the primary, as the submit path enqueues it."""
    entry = RequestEntry(new_job_id("m", "stable"), {"inputs": {"text": text}}, now_ms())
    await store.create(entry, KEYS.queue("m", "stable"), {"model": "m", "variant": "stable"})
    return entry


async def _mirror_jobs(client: aioredis.Redis) -> int:
    jobs = await client.keys(f"{KEYS.prefix}job:*")
    variants = [await client.hget(key, "variant") for key in jobs]
    return variants.count(b"mirror")


async def _shadowed(copies: ShadowCopies, entry: RequestEntry) -> None:
    copies.copy(CONFIG, ROUTES, entry, "stable")
    await copies.stop()  # the copies run in the background; wait for them here


async def test_a_copy_goes_to_the_shadow_bulk_lane_until_it_is_full(aredis: aioredis.Redis) -> None:
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    copies = ShadowCopies(store, pairs, KEYS)
    enqueued, dropped = _copies("enqueued"), _copies("dropped")

    for n in range(2):
        await _shadowed(copies, await _online(store, f"copied {n}"))
    assert await aredis.xlen(MIRROR) == 2
    kept = await pairs.pending("m", 10)
    assert len(kept) == 2 and _copies("enqueued") == enqueued + 2
    for pair, _ in kept:
        copy = await store.get(pair.shadow_id)
        assert copy is not None and copy.fields["variant"] == "mirror"
        assert copy.fields["tenant"] == SHADOW_TENANT  # no key's tenant can read it

    entry = await _online(store, "not copied: the lane is full")
    await _shadowed(copies, entry)
    assert _copies("dropped") == dropped + 1 and _copies("enqueued") == enqueued + 2
    assert await aredis.xlen(MIRROR) == 2 and len(await pairs.pending("m", 10)) == 2
    assert await _mirror_jobs(aredis) == 2  # the dropped copy wrote no job hash either
    primary = await store.get(entry.job_id)
    assert primary is not None and primary.fields["status"] == "queued"
