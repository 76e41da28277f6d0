"""Shadow pairs that cannot settle yet, on a real Valkey: a down shadow's pairs (its copies
waiting in its bulk lane) hold up no other shadow's comparisons, a model whose pairs Redis
refuses holds up no other model's, and a pair waits as long as its model lets copies queue."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from producer_api.routes.shadowing import PAIRS_PER_PAGE, ShadowComparisons
from shared.codec import dumps
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, QueueLimits, Variant
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats

KEYS = Keys("shadow-r11:")
SHADOW = Variant(weight=0, shadow=True)
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    default_variant="stable",
    variants={"stable": Variant(), "down": SHADOW, "echo": SHADOW},
)


async def _pairs(client: aioredis.Redis, pairs: ShadowPairs, count: int, shadow: str) -> None:
    """`count` pending pairs of `shadow`: its copies still queued (`down`), or both jobs
    succeeded with the same answer; hashes as a worker leaves them, in one pipeline."""
    queued: dict[Any, Any] = {"model": "m", "status": "queued", "created": 1}
    answer = dumps({"embeddings": [[1.0]]}).decode()
    ended: dict[Any, Any] = {
        **queued,
        "status": "succeeded",
        "started": 2,
        "finished": 5,
        "outputs": answer,
    }
    made = [
        ShadowPair(new_job_id("m", "stable"), new_job_id("m", shadow), "stable", shadow)
        for _ in range(count)
    ]
    async with client.pipeline(transaction=False) as pipe:
        for pair in made:
            copy = queued if shadow == "down" else ended
            pipe.hset(KEYS.job(pair.primary_id), mapping={**ended, "variant": "stable"})
            pipe.hset(KEYS.job(pair.shadow_id), mapping={**copy, "variant": shadow})
        await pipe.execute()
    for pair in made:
        await pairs.add("m", pair)


async def test_a_page_of_waiting_pairs_does_not_hold_up_the_pairs_behind_it(
    aredis: aioredis.Redis,
) -> None:
    """A look stopped at the first page that settled nothing, and the next look began at the
    first page again: with a page's worth of a down shadow's pairs ahead (copies waiting in its
    bulk lane), no pair behind them was compared until those were dropped as too old, so
    every other shadow's agreement lagged 15 minutes. Now the looks go on where the last
    stopped: each finished pair is compared within as many looks as the set has pages."""
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats = VariantStats(aredis, KEYS)
    waiting = PAIRS_PER_PAGE + 44
    await _pairs(aredis, pairs, waiting, "down")
    await _pairs(aredis, pairs, 10, "echo")
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60)

    for _ in range(math.ceil((waiting + 10) / PAIRS_PER_PAGE)):
        await comparisons.look()

    window = (await stats.window("m", ["echo"], time.time() - 60))["echo"]
    assert window.counters["shadow_pairs"] == 10 and window.counters["shadow_agreed"] == 10
    left = {pair.shadow_variant for pair, _ in await pairs.pending("m", 1_000)}
    assert left == {"down"} and len(await pairs.pending("m", 1_000)) == waiting


async def test_a_model_whose_pairs_cannot_be_read_holds_up_no_other_model(
    aredis: aioredis.Redis,
) -> None:
    """A look raised at the first model whose page Redis refused (on a cluster, the master of
    its jobs' slots failing over), and every look after it raised there again: the models
    after it in the repository had no pair compared until it came back. Now each model's pages
    are settled and the look raises the refusal afterwards (the loop backs off as before)."""
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats = VariantStats(aredis, KEYS)
    await aredis.set(KEYS.shadow_pairs("a"), "not a sorted set")  # every read of it is refused
    await _pairs(aredis, pairs, 10, "echo")
    first = CONFIG.model_copy(update={"name": "a"})
    repository = ModelRepository({"a": first, "m": CONFIG})
    comparisons = ShadowComparisons(pairs, store, stats, repository, 60)

    with pytest.raises(ResponseError):
        await comparisons.look()

    window = (await stats.window("m", ["echo"], time.time() - 60))["echo"]
    assert window.counters["shadow_pairs"] == 10 and await pairs.pending("m", 100) == []


async def test_a_pair_waits_as_long_as_its_model_lets_copies_queue(aredis: aioredis.Redis) -> None:
    """Pairs were dropped as too old 15 minutes after their submit whatever the model: with
    `max_queue_time_s: 1800` a copy still queued after 20 minutes may yet run (its worker
    expires it only at 30), and it ran uncompared. Now a model whose copies may wait longer
    than the default keeps its pairs that much longer, and drops them past it."""
    store, pairs = JobStore(aredis, KEYS, ttl_s=3600), ShadowPairs(aredis, KEYS, ttl_s=3600)
    patient = CONFIG.model_copy(update={"queue": QueueLimits(max_queue_time_s=1800)})
    comparisons = ShadowComparisons(
        pairs, store, VariantStats(aredis, KEYS), ModelRepository({"m": patient}), 60
    )
    await _pairs(aredis, pairs, 2, "down")
    (young, _), (old, _) = await pairs.pending("m", 10)
    minute = 60_000
    await aredis.zadd(KEYS.shadow_pairs("m"), {young.member(): now_ms() - 20 * minute})
    await aredis.zadd(KEYS.shadow_pairs("m"), {old.member(): now_ms() - 36 * minute})

    await comparisons.look()

    assert [pair for pair, _ in await pairs.pending("m", 10)] == [young]
