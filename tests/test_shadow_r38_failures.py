"""A pair one of whose jobs failed compares no answers: it read as similarity 0 (or, both failed,
1), summed into the shadow's `mean_similarity`. For embeddings 0 is better than an opposite
answer (-1), so a shadow failing half its copies of agreeing answers read 0.5. Failures are
counted apart (the shadow's own success rate, its pairs' failures by whose) and the mean
similarity is over the pairs whose two jobs answered. On a real Valkey, in process, as the
traffic leader compares pairs."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from producer_api.console.api_router import templates
from producer_api.console.route_board import RouteRow
from producer_api.experiments.statistics import summary
from producer_api.routes.shadowing import ShadowComparisons
from shared.codec import RequestEntry, dumps
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.model_repository import ModelRepository
from shared.shadow_pairs import ShadowPairs
from shared.variant_stats import VariantStats, Window
from tests.test_shadow_copies import CONFIG, KEYS
from tests.test_shadow_r21_edges import _paired, _ran


async def _failed(store: JobStore, entry: RequestEntry) -> None:
    """The job ran and its engine raised."""
    await store.transition(entry.job_id, JobStatus.RUNNING, {"started": now_ms() - 5})
    error = dumps({"type": "engine_error", "message": "boom"}).decode()
    await store.transition(entry.job_id, JobStatus.FAILED, {"error": error, "finished": now_ms()})


# each pair's fate: (the primary answered, the shadow answered)
FATES = {
    "both": (True, True),
    "shadow": (True, False),
    "primary": (False, True),
    "none": (False, False),
}


async def compared_fates(
    aredis: aioredis.Redis,
) -> tuple[dict[str, Any], ShadowPairs, dict[str, str]]:
    """One pair of each of FATES compared as the traffic leader compares them: the shadow's
    summary, the pairs' store, and each fate's primary job id."""
    await aredis.flushdb()
    store, pairs = JobStore(aredis, KEYS, ttl_s=60), ShadowPairs(aredis, KEYS, ttl_s=60)
    stats = VariantStats(aredis, KEYS)
    primaries = {}
    for name, fates in FATES.items():
        jobs = await _paired(store, pairs)
        for job, answered in zip(jobs, fates, strict=True):
            await (_ran(store, job, 10) if answered else _failed(store, job))
        primaries[name] = jobs[0].job_id

    await ShadowComparisons(pairs, store, stats, ModelRepository({"m": CONFIG}), 60).look()

    window = (await stats.window("m", ["mirror"], time.time() - 60))["mirror"]
    return summary(window)["shadow"], pairs, primaries


async def test_a_failed_job_is_no_similarity(aredis: aioredis.Redis) -> None:
    compared, pairs, primaries = await compared_fates(aredis)
    assert compared["pairs"] == 4 and compared["agreement"] == 1.0  # "both"'s alone
    assert compared["mean_similarity"] == 1.0  # "both"'s alone: equal embeddings
    assert (await pairs.result(primaries.pop("both")))["similarity:mirror"] == "1.000000"
    for primary_id in primaries.values():
        result = await pairs.result(primary_id)
        assert "similarity:mirror" not in result and "similarity" not in result, result


def test_no_similarity_before_a_pair_of_answers() -> None:
    """Every pair with a failure: no mean similarity, not 0, and the console's Routes page says
    so (it formatted the figure as a number)."""
    window = Window()
    window.counters |= {
        "shadow_pairs": 2,
        "shadow_unscored_pairs": 2,
        "shadow_failed_shadow_only": 2,
    }
    compared = summary(window)["shadow"]
    assert compared["mean_similarity"] is None
    shadows = [{"variant": "mirror", "rate": 1.0, "compared": compared}]
    row = RouteRow("m", 1, "none", {"stable": 100.0}, shadows, None, None)
    page = templates.get_template("routes.html").render(rows=[row], session=None, base="")
    assert "2 pairs · \u2013 agree (0 answered) · similarity \u2013 · latency" in page
