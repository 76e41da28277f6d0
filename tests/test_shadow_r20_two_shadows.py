"""A request copied to two shadow variants, on a real Valkey with the traffic fixtures' model and
its real engine (`tests/fault_engine.py`, run in process): each shadow's comparison is kept
beside the primary's result, whichever look compares it."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.routes.shadowing import ShadowComparisons, ShadowCopies
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelRepository
from shared.routing import Routes
from shared.shadow_pairs import ShadowPair, ShadowPairs
from shared.variant_stats import VariantStats
from tests.conftest import REPO_ROOT
from tests.fault_engine import FaultEngine

KEYS = Keys("shadow-r20:")
TRAFFIC = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
CONFIG = TRAFFIC.models["ab"]
ROUTES = Routes(weights={"stable": 100.0}, shadows={"mirror": 1.0, "flaky": 1.0})


def _engine(variant: str) -> FaultEngine:
    """The variant's engine, loaded as its worker loads it."""
    engine = FaultEngine(CONFIG, variant, "")
    engine.load()
    return engine


ENGINES = {variant: _engine(variant) for variant in ("stable", "mirror", "flaky")}


def _failing_input() -> dict[str, Any]:
    """An input `flaky` (fail_percent 20) fails and the others answer: the same every run."""
    return next(
        item
        for item in ({"text": f"shadowed {n}"} for n in range(100))
        if ENGINES["flaky"]._fails(item)
    )


async def _run(client: aioredis.Redis, store: JobStore, stream: str, variant: str) -> None:
    """Run the lane's jobs on their variant's engine and end them, as a worker does."""
    for _, fields in await client.xrange(stream):
        entry = RequestEntry.decode(fields)
        await store.transition(entry.job_id, JobStatus.RUNNING, {"started": now_ms()})
        try:
            [output] = ENGINES[variant].infer([entry.payload["inputs"]])
        except RuntimeError as exc:
            ended: dict[str, str | int] = {"error": dumps({"message": str(exc)}).decode()}
            await store.transition(entry.job_id, JobStatus.FAILED, ended)
        else:
            ended = {"outputs": dumps(output).decode()}
            await store.transition(entry.job_id, JobStatus.SUCCEEDED, ended)


async def _shadowed(client: aioredis.Redis) -> tuple[JobStore, ShadowPairs, list[ShadowPair]]:
    """An online request on `stable`, accepted and copied to both shadows, and its two pairs."""
    await client.flushdb()
    store, pairs = JobStore(client, KEYS, ttl_s=60), ShadowPairs(client, KEYS, ttl_s=60)
    entry = RequestEntry(new_job_id("ab", "stable"), {"inputs": _failing_input()}, now_ms())
    await store.create(entry, KEYS.queue("ab", "stable"), {"model": "ab", "variant": "stable"})
    copies = ShadowCopies(store, pairs, KEYS)
    copies.copy(CONFIG, ROUTES, entry, "stable")
    await copies.stop()
    await _run(client, store, KEYS.queue("ab", "stable"), "stable")
    made = sorted(
        (pair for pair, _ in await pairs.pending("ab", 10)), key=lambda pair: pair.shadow_variant
    )
    assert [pair.shadow_variant for pair in made] == ["flaky", "mirror"]
    return store, pairs, made


@pytest.mark.parametrize("looks", ["one look", "a look each"])
async def test_each_shadow_keeps_its_own_comparison(aredis: aioredis.Redis, looks: str) -> None:
    """The primary's result had one set of comparison fields: the second shadow compared wrote
    over the first's, so an operator reading a request's comparison saw one shadow's (here
    `flaky` failing, or `mirror` agreeing) and never the other's. Each is kept now, named by
    its shadow variant, whether both are compared in one page or in looks apart."""
    store, pairs, made = await _shadowed(aredis)
    comparisons = ShadowComparisons(pairs, store, VariantStats(aredis, KEYS), TRAFFIC, 60)
    for pair in made:
        await _run(aredis, store, KEYS.bulk_queue("ab", pair.shadow_variant), pair.shadow_variant)
        if looks == "a look each":
            await comparisons.look()
    await comparisons.look()

    assert await pairs.pending("ab", 10) == []
    result = await pairs.result(made[0].primary_id)
    flaky, mirror = made
    assert result["shadow_id:flaky"] == flaky.shadow_id
    assert "agree:flaky" not in result and result["error_delta:flaky"] == "1"  # no answer
    assert result["shadow_id:mirror"] == mirror.shadow_id
    assert (result["agree:mirror"], result["error_delta:mirror"]) == ("1", "0")
    assert result["similarity:mirror"] == "1.000000"
    assert {"latency_delta_ms:flaky", "latency_delta_ms:mirror"} <= set(result)
    # the unnamed fields, a single shadow's shape, are the last compared shadow's, all of them
    last = mirror if result["shadow_variant"] == "mirror" else flaky
    assert result["primary_variant"] == "stable" and result["shadow_id"] == last.shadow_id
    assert result.get("agree") == result.get(f"agree:{last.shadow_variant}")
