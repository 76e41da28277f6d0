"""The dashboard never merges the online and bulk lanes where their values do not add up. A
Batch API item, a bulk submission or a shadow's copy waits behind online work by design, for
minutes or hours: the *p99 latency per variant* panel summed both lanes' buckets, so a few of them
made a healthy canary's p99 read minutes, where the canary's own latency bound reads its online
jobs alone (producer_api/canary/controller.py); and *Oldest queued entry age* took the older of
the two lanes, so a day-old Batch API item hid an online queue that had stalled."""

from __future__ import annotations

import re

from shared.metrics import E2E_LATENCY, OLDEST_AGE, QUEUE_WAIT
from tests.test_compose import dashboard_exprs

# Families kept per lane whose lanes neither add up nor compare: latency quantiles, and the
# oldest entry's age (the lag and submit counts of both lanes do add up).
PER_LANE = {
    family.name for metric in (E2E_LATENCY, QUEUE_WAIT, OLDEST_AGE) for family in metric.describe()
}
# `by (labels) (family{selector}` or `by (labels) (rate(family_bucket{selector}[…])`.
AGGREGATED = re.compile(r"\bby \(([^)]*)\) \((?:rate\()?(\w+?)(?:_bucket)?\{([^}]*)\}")


def mixed_lanes(exprs: list[str]) -> list[str]:
    """The queries that aggregate a PER_LANE family neither keeping `lane` nor selecting one."""
    mixed = []
    for expr in exprs:
        for grouping, family, selector in AGGREGATED.findall(expr):
            kept = {label.strip() for label in grouping.split(",")}
            one_lane = re.search(r'\blane="\w+"', selector)
            if family in PER_LANE and "lane" not in kept and not one_lane:
                mixed.append(expr)
    return mixed


def test_the_dashboard_never_mixes_the_online_and_bulk_lanes() -> None:
    exprs = [e for group in dashboard_exprs().values() for e in group]
    parsed = {family for expr in exprs for _, family, _ in AGGREGATED.findall(expr)}
    assert parsed >= PER_LANE, "the queries no longer parse: this test checks nothing"
    assert mixed_lanes(exprs) == []
