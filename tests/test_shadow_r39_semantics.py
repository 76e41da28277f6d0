"""A shadow's agreement is over the pairs whose two jobs answered, and its failures are counted by
whose, as shadow tests report error rates apart. Two failures counted as an agreement, a failed
shadow beside a good primary as a disagreement, and the error delta, averaged over all pairs,
netted a shadow failing where the primary answered against one answering where it failed: a
shadow failing half its pairs read "error delta 0". On a real Valkey, in process, as the traffic
leader compares pairs."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from producer_api.console.api_router import templates
from producer_api.console.route_board import RouteRow
from producer_api.experiments.statistics import summary
from shared.shadow_compare import compare
from shared.variant_stats import VariantStats
from tests.test_shadow_copies import KEYS
from tests.test_shadow_r38_failures import compared_fates


async def test_agreement_is_over_answered_pairs_and_failures_are_counted_by_whose(
    aredis: aioredis.Redis,
) -> None:
    compared, pairs, primaries = await compared_fates(aredis)
    assert "error_delta" not in compared
    shown = {k: compared[k] for k in ("pairs", "answered_pairs", "agreement")}
    assert shown == {"pairs": 4, "answered_pairs": 1, "agreement": 1.0}  # was 0.5: "none" agreed
    failed = {k: compared[k] for k in ("shadow_only_failed", "primary_only_failed", "both_failed")}
    assert failed == {"shadow_only_failed": 1, "primary_only_failed": 1, "both_failed": 1}
    both = await pairs.result(primaries.pop("both"))
    assert (both["agree:mirror"], both["error_delta:mirror"]) == ("1", "0")
    deltas = {"shadow": "1", "primary": "-1", "none": "0"}  # the pair's own: whose failure
    for name, primary_id in primaries.items():
        result = await pairs.result(primary_id)
        assert "agree:mirror" not in result and "agree" not in result, (name, result)
        assert result["error_delta:mirror"] == deltas[name], (name, result)


async def test_no_agreement_before_a_pair_of_answers(aredis: aioredis.Redis) -> None:
    """Every pair with a failure: agreement None, not 0 % (or 100 % of two failures), and the
    console's Routes page shows the failures by whose instead of a netted delta."""
    await aredis.flushdb()
    stats = VariantStats(aredis, KEYS)
    timings = {"created": 100.0, "started": 100.5, "finished": 100.51}
    ok = {"status": "succeeded", "outputs": {"x": 1}, "timings": timings}
    failed = {"status": "failed", "timings": timings}
    for primary, shadow in ((ok, failed), (failed, failed)):
        comparison = compare(primary, shadow)
        assert comparison is not None
        await stats.add_counts("m", "mirror", comparison.counts())

    window = (await stats.window("m", ["mirror"], time.time() - 60, samples=False))["mirror"]
    compared = summary(window)["shadow"]
    assert compared["agreement"] is None and compared["answered_pairs"] == 0
    shadows = [{"variant": "mirror", "rate": 1.0, "compared": compared}]
    row = RouteRow("m", 1, "none", {"stable": 100.0}, shadows, None, None)
    page = templates.get_template("routes.html").render(rows=[row], session=None, base="")
    assert "2 pairs · \u2013 agree (0 answered) · similarity \u2013 · latency" in page
    assert "failed: shadow only 1, primary only 0, both 1</small>" in page
