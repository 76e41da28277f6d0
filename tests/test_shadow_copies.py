"""Shadow copies on a real Valkey, without a stack: a sampled online request is copied to its
shadow's bulk lane and the pair is kept for comparison; a full shadow lane drops the copy (it is
counted as dropped, and nothing half-written stays behind), and the client's job is untouched.
The stack's side (the copy runs, is compared, never reaches the client) is
`tests/test_routes.py`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.valkey_cluster import LocalCluster
from producer_api.routes import shadowing
from producer_api.routes.shadowing import (
    MAX_COPIES_IN_FLIGHT,
    PAIRS_PER_PAGE,
    SHADOW_TENANT,
    ShadowComparisons,
    ShadowCopies,
)
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelConfig, ModelRepository, QueueLimits, Variant
from shared.redis_client import RedisClient
from shared.routing import Routes
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats

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


def _dropped(reason: str) -> float:
    labels = {"model": "m", "variant": "mirror", "reason": reason}
    return REGISTRY.get_sample_value("conveyor_shadow_pairs_dropped_total", labels) or 0.0


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


async def test_copies_past_the_bound_in_flight_are_dropped_and_counted(
    aredis: aioredis.Redis,
) -> None:
    """Copies in flight had no bound: while Redis was slow every accepted request added a task
    that held its payload and queued for the pool's connections. A burst of requests before any
    copy's round trip is answered stands for it here: the copies past MAX_COPIES_IN_FLIGHT are
    dropped at once (`busy`), the others land, and once they have, copies start again."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    roomy = CONFIG.model_copy(update={"queue": QueueLimits(max_length=1_000)})
    copies = ShadowCopies(store, pairs, KEYS)
    busy, enqueued = _copies("busy"), _copies("enqueued")
    entries = [await _online(store, f"burst {n}") for n in range(MAX_COPIES_IN_FLIGHT + 3)]

    for entry in entries:
        copies.copy(roomy, ROUTES, entry, "stable")  # returns at once: nothing awaited
    assert _copies("busy") == busy + 3
    await copies.stop()

    assert _copies("enqueued") == enqueued + MAX_COPIES_IN_FLIGHT
    assert len(await pairs.pending("m", 1_000)) == MAX_COPIES_IN_FLIGHT
    copies.copy(roomy, ROUTES, await _online(store, "after the burst"), "stable")
    await copies.stop()
    assert await aredis.xlen(MIRROR) == MAX_COPIES_IN_FLIGHT + 1
    assert _copies("busy") == busy + 3


async def test_pairs_dropped_uncompared_are_counted_once(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pairs still running past MAX_PAIR_AGE_MS, or whose jobs' hashes are gone, were dropped
    with nothing an operator could see. Two looks at once (leaders a lapsed lease let overlap)
    count each drop once, as they compare each pair once."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats, repository = VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG})
    too_old, vanished = _dropped("too_old"), _dropped("vanished")
    await _pairs(aredis, pairs, 7, status="running")
    for _ in range(4):  # their jobs' hashes expired
        ids = new_job_id("m", "stable"), new_job_id("m", "mirror")
        await pairs.add("m", ShadowPair(*ids, "stable", "mirror"))
    monkeypatch.setattr(shadowing, "MAX_PAIR_AGE_MS", -60_000)  # every pair is too old

    comparisons = ShadowComparisons(pairs, store, stats, repository, 60)
    await asyncio.gather(comparisons.look(), comparisons.look())

    assert await pairs.pending("m", 100) == []
    assert (_dropped("too_old"), _dropped("vanished")) == (too_old + 7, vanished + 4)


async def _ran(store: JobStore, entry: RequestEntry, outputs: Any) -> None:
    """The job ran to `outputs`, as a worker writes it."""
    await store.transition(entry.job_id, JobStatus.RUNNING, {"started": now_ms()})
    fields = {"outputs": dumps(outputs).decode(), "finished": now_ms()}
    await store.transition(entry.job_id, JobStatus.SUCCEEDED, fields)


async def test_pairs_are_counted_once_and_one_that_cannot_compare_blocks_none(
    aredis: aioredis.Redis,
) -> None:
    """A shadow answering NaN (stored as null) made its pair's comparison raise: the pair stayed
    first in line and no pair after it was compared again. And two looks at once (leaders a
    lapsed lease let overlap, a look rerun after a blip) counted the same pairs twice."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats = VariantStats(aredis, KEYS)
    answers = [[[1.0, None]], [[1.0, 0.0]], [[0.0, 1.0]]]  # the shadow's: NaN, agrees, differs
    for n, shadow_answer in enumerate(answers):
        primary = await _online(store, f"compared {n}")
        shadow = RequestEntry(new_job_id("m", "mirror"), {"inputs": {}}, now_ms())
        await store.create(shadow, MIRROR, {"model": "m", "variant": "mirror"})
        await pairs.add("m", ShadowPair(primary.job_id, shadow.job_id, "stable", "mirror"))
        await _ran(store, primary, {"embeddings": [[1.0, 0.0]]})
        await _ran(store, shadow, {"embeddings": shadow_answer})
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60)

    await asyncio.gather(comparisons.look(), comparisons.look())

    assert await pairs.pending("m", 10) == []
    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    assert window.counters["shadow_pairs"] == 3 and window.counters["shadow_agreed"] == 1


def _fail_once(monkeypatch: pytest.MonkeyPatch, owner: object, method: str) -> None:
    """`owner.method` raises a lost connection on its first call, then is itself again."""

    async def blip(*args: Any) -> None:
        monkeypatch.undo()
        raise RedisConnectionError("connection lost")

    monkeypatch.setattr(owner, method, blip)


@pytest.mark.parametrize("failing", ["pairs.store", "stats.add_counts_once", "pairs.done"])
async def test_a_page_that_fails_after_claiming_is_settled_by_a_later_look(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A page's pairs were removed before they were counted: a Redis error while counting lost
    them uncounted. Claimed instead, they went back to pending once the claim was abandoned (at
    once here) and the next look counted them again if the page had failed after counting
    (releasing the claims). Now each pair is counted and stored once, wherever the page failed."""
    await aredis.flushdb()
    store, stats = JobStore(aredis, KEYS, ttl_s=60), VariantStats(aredis, KEYS)
    pairs = ShadowPairs(aredis, KEYS, ttl_s=60, settle_within_ms=0)
    made = await _pairs(aredis, pairs, 10)
    owner, method = failing.split(".")
    _fail_once(monkeypatch, {"stats": stats, "pairs": pairs}[owner], method)
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60)
    with pytest.raises(RedisConnectionError):
        await comparisons.look()

    await comparisons.look()
    await comparisons.look()  # the claims were released: none goes back to be counted again

    assert await pairs.pending("m", 100) == []
    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    assert window.counters["shadow_pairs"] == 10 and window.counters["shadow_agreed"] == 10
    for pair in made:
        assert (await pairs.result(pair.primary_id))["agree"] == "1"
    assert await aredis.keys(KEYS.shadow_page("*")) == []  # each page forgotten once added


async def test_a_page_counted_for_one_shadow_but_not_another_counts_each_once(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page counts each shadow variant in its own call: one failing after another had added
    its counts left the claims, and the next look counted every variant's pairs again."""
    await aredis.flushdb()
    store, stats = JobStore(aredis, KEYS, ttl_s=60), VariantStats(aredis, KEYS)
    pairs = ShadowPairs(aredis, KEYS, ttl_s=60, settle_within_ms=0)
    await _pairs(aredis, pairs, 10)
    await _pairs(aredis, pairs, 10, shadow="echo")
    add, mirror_counted = stats.add_counts_once, asyncio.Event()

    async def echo_fails_once(model: str, variant: str, *args: Any) -> None:
        if variant == "echo":
            monkeypatch.undo()
            await mirror_counted.wait()  # fails after mirror's counts were added
            raise RedisConnectionError("connection lost")
        await add(model, variant, *args)
        mirror_counted.set()

    monkeypatch.setattr(stats, "add_counts_once", echo_fails_once)
    config = CONFIG.model_copy(
        update={"variants": {**CONFIG.variants, "echo": CONFIG.variants["mirror"]}}
    )
    comparisons = ShadowComparisons(pairs, store, stats, ModelRepository({"m": config}), 60)
    with pytest.raises(RedisConnectionError):
        await comparisons.look()

    await comparisons.look()
    await comparisons.look()

    assert await pairs.pending("m", 100) == []
    windows = await stats.window("m", ["mirror", "echo"], time.time() - 60)
    assert {v: w.counters["shadow_pairs"] for v, w in windows.items()} == {"mirror": 10, "echo": 10}


async def test_a_request_for_the_shadow_itself_is_not_shadowed_onto_itself(
    aredis: aioredis.Redis,
) -> None:
    """A client that names the shadow variant runs on it: a copy would be a second `mirror` job
    on its bulk lane and a mirror-vs-mirror pair pushing its agreement toward 100 %."""
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    copies = ShadowCopies(store, pairs, KEYS)
    entry = RequestEntry(new_job_id("m", "mirror"), {"inputs": {"text": "explicit"}}, now_ms())
    await store.create(entry, KEYS.queue("m", "mirror"), {"model": "m", "variant": "mirror"})

    copies.copy(CONFIG, ROUTES, entry, "mirror")
    await copies.stop()

    assert await aredis.xlen(MIRROR) == 0 and await pairs.pending("m", 10) == []


async def _pairs(
    client: RedisClient,
    pairs: ShadowPairs,
    count: int,
    status: str = "succeeded",
    shadow: str = "mirror",
    outputs: Any = None,
) -> list[ShadowPair]:
    """`count` pending pairs of `shadow` whose two jobs are at `status` (succeeded: the same
    answer, `outputs` or one embedding of one number), their hashes as a worker leaves them
    (written in one pipeline: 2 000 jobs one by one take long)."""
    job = {"model": "m", "status": status, "created": 1}
    if status == "succeeded":
        answer = dumps(outputs or {"embeddings": [[1.0]]}).decode()
        job |= {"started": 2, "finished": 5, "outputs": answer}
    made = [
        ShadowPair(new_job_id("m", "stable"), new_job_id("m", shadow), "stable", shadow)
        for _ in range(count)
    ]
    async with client.pipeline(transaction=False) as pipe:
        for pair in made:
            for job_id, variant in ((pair.primary_id, "stable"), (pair.shadow_id, shadow)):
                pipe.hset(KEYS.job(job_id), mapping={**job, "variant": variant})
        await pipe.execute()
    for pair in made:
        await pairs.add("m", pair)
    return made


async def _settles_every_page(client: RedisClient) -> None:
    """Pairs were settled 256 a look, three round trips each, a look every 0.5 s: past ~500
    shadowed requests a second the pending set grew without end. A look with no time to spare
    settles one page; one with time settles every page, counts and stores each pair once."""
    store, pairs = JobStore(client, KEYS, ttl_s=60), ShadowPairs(client, KEYS, ttl_s=60)
    stats, repository = VariantStats(client, KEYS), ModelRepository({"m": CONFIG})
    made = await _pairs(client, pairs, 1_000)

    await ShadowComparisons(pairs, store, stats, repository, budget_s=0).look()
    assert len(await pairs.pending("m", 1_000)) == 1_000 - PAIRS_PER_PAGE
    await ShadowComparisons(pairs, store, stats, repository, budget_s=60).look()

    assert await pairs.pending("m", 1_000) == []
    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    assert window.counters["shadow_pairs"] == 1_000 and window.counters["shadow_agreed"] == 1_000
    for pair in (made[0], made[-1]):
        result = await pairs.result(pair.primary_id)
        assert result["shadow_id"] == pair.shadow_id and result["agree"] == "1"
        assert result["primary_variant"] == "stable" and result["shadow_variant"] == "mirror"
        assert 0 < await client.ttl(KEYS.shadow_result(pair.primary_id)) <= 60


async def test_a_look_settles_every_page_of_finished_pairs(aredis: aioredis.Redis) -> None:
    await _settles_every_page(aredis)


@pytest.mark.slow
async def test_a_look_settles_pairs_whose_jobs_live_on_other_masters(
    cluster: LocalCluster, cluster_client: RedisClient
) -> None:
    """On a cluster the pending set and the results live in `{ctl}`'s slot, the job hashes in
    their partitions' slots: the pages' pipelines must split or stay within one slot."""
    control = cluster.master_of(KEYS.shadow_pairs("m")).port
    assert control != cluster.master_of(KEYS.job(new_job_id("m", "stable"))).port
    assert control != cluster.master_of(KEYS.job(new_job_id("m", "mirror"))).port
    await _settles_every_page(cluster_client)


async def test_pairs_still_running_wait_without_holding_up_those_after_them(
    aredis: aioredis.Redis,
) -> None:
    """A page's pairs still running stay pending and the next page starts past them: every
    finished pair of the set is settled in one look, whatever the running ones' ranks."""
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats, repository = VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG})
    running = await _pairs(aredis, pairs, 100, status="running")
    await _pairs(aredis, pairs, 200)

    await ShadowComparisons(pairs, store, stats, repository, budget_s=60).look()

    assert {pair for pair, _ in await pairs.pending("m", 1_000)} == set(running)
    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    assert window.counters["shadow_pairs"] == 200


async def test_comparing_a_page_leaves_the_event_loop_free(aredis: aioredis.Redis) -> None:
    """A page's comparisons ran in pure Python on the traffic leader's loop, the API's: a
    mirror shadow of minilm (256 pairs of 32 vectors of 384 floats) held it for seconds, and
    every reply of that producer waited. Now they run off the loop: a task sleeping 10 ms at a
    time keeps waking while the look runs, its longest wait a small share of the look."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats, repository = VariantStats(aredis, KEYS), ModelRepository({"m": CONFIG})
    await _pairs(aredis, pairs, PAIRS_PER_PAGE, outputs={"embeddings": [[0.1] * 384] * 32})
    comparisons = ShadowComparisons(pairs, store, stats, repository, budget_s=0)
    waits: list[float] = []

    async def probe() -> None:
        woke = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            waits.append(time.monotonic() - woke)
            woke = time.monotonic()

    prober = asyncio.create_task(probe())
    started = time.monotonic()
    await comparisons.look()
    took = time.monotonic() - started
    prober.cancel()

    assert waits and max(waits) < took / 4
    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    assert window.counters["shadow_pairs"] == PAIRS_PER_PAGE
    assert window.counters["shadow_agreed"] == PAIRS_PER_PAGE
