"""One tenant flooding a model does not push another tenant's queue wait up without bound.

The producer-side guarantee: a key holds at most `max_in_flight` jobs queued or running, so a
partition never holds more than the sum of its tenants' caps. One worker takes micro-batches of
up to B jobs that each take T; a job arriving behind a flooder capped at C, with Q of its own
tenant's jobs still queued, waits for at most the batch in hand plus ceil((C + Q) / B) batches.
Here B = 4, T = 250 ms, C = 4 and Q <= 2 (one quiet job every 0.4 s, each done within ~1 s):
three batches, 750 ms, plus 500 ms for scheduling on a loaded two-core machine, so every queue
wait of the quiet tenant but its worst (one stall of a loaded machine is forgiven: the bound
is per job) must stay under BOUND_MS = 1250. The same flood without the cap (the control) must
break that bound, which shows that the cap is what holds it.

Fair queuing (`queue.fair`, model `fair`) holds without any cap: an uncapped flood is held back
per tenant and the lane serves tenants in turn, so the quiet tenant's jobs overtake the flood's
backlog instead of waiting it out (benchmark part F measures this at 2,000 jobs)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conveyor.stack import Stack
from tests.conftest import REPO_ROOT, issue_key, running_stack, serve

pytestmark = pytest.mark.slow
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "fairness_repository"
BATCH_MS = 250  # the fault engine sleeps this long per micro-batch of `slow` (up to 4 jobs)
CAP = 4
BOUND_MS = 1250
FLOOD_S = 6.0
QUIET_EVERY_S = 0.4
MAX_FLOOD = 160  # ten seconds of work for the worker (the capped flood stays under it)
# The control's flood: five seconds of work, drained by about when the quiet tenant stops
# (FLOOD_S); a quiet job behind the backlog it stands at waits seconds, well past BOUND_MS.
# MAX_FLOOD's ten seconds only lengthened the drain the test then sat out.
CONTROL_FLOOD = 80
NO_LIMITS = {"rate_per_s": 100_000.0, "burst": 100_000}


@pytest.fixture(scope="module")
def fair_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Auth on, the `slow` test model and one worker serving it."""
    with running_stack(
        tmp_path_factory.mktemp("fairness"),
        CONVEYOR_AUTH="enabled",
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),  # the fault engine lives in tests/
        workers=("slow",),
    ) as stack:
        yield stack


def _job(model: str = "slow", sleep_ms: int = BATCH_MS) -> dict[str, Any]:
    return {"model": model, "inputs": {"sleep_ms": sleep_ms}}


async def _flood(
    client: httpx.AsyncClient, key: str, until: float, admitted: list[str], most: int
) -> None:
    """A misbehaving client: submits as fast as it can and retries 429s almost at once, until
    `until` or until `most` jobs are in (which bounds how long the control takes to drain)."""
    while time.monotonic() < until and len(admitted) < most:
        response = await client.post("/v1/jobs", json=_job(), headers={"X-API-Key": key})
        if response.status_code == 202:
            admitted.append(response.json()["id"])
        else:
            assert response.status_code == 429, response.text
            await asyncio.sleep(0.01)


async def _quiet(client: httpx.AsyncClient, key: str, until: float) -> list[str]:
    """A well-behaved tenant: one job every QUIET_EVERY_S while the flood runs."""
    start = time.monotonic() + 1.0  # let the flood fill the partition first
    ids: list[str] = []
    while (due := start + len(ids) * QUIET_EVERY_S) < until:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        response = await client.post("/v1/jobs", json=_job(), headers={"X-API-Key": key})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def _succeeded(client: httpx.AsyncClient, key: str, ids: list[str]) -> list[dict[str, Any]]:
    jobs = []
    for job_id in ids:
        response = await client.get(
            f"/v1/jobs/{job_id}", params={"wait": 60}, headers={"X-API-Key": key}
        )
        job = response.json()
        assert job["status"] == "succeeded", job
        jobs.append(job)
    return jobs


async def _queue_waits(client: httpx.AsyncClient, key: str, ids: list[str]) -> list[float]:
    return [job["timings"]["queue_wait_ms"] for job in await _succeeded(client, key, ids)]


def _second_worst(values: list[float]) -> float:
    return sorted(values)[-2]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _scenario(
    base_url: str, flooder: str, quiet: str, most: int = MAX_FLOOD
) -> tuple[int, list[float]]:
    """Run the flood (up to `most` jobs) and the quiet tenant side by side; the flood's count
    and quiet waits."""
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        until = time.monotonic() + FLOOD_S
        admitted: list[str] = []
        floods = [_flood(client, flooder, until, admitted, most) for _ in range(8)]
        quiet_ids = asyncio.ensure_future(_quiet(client, quiet, until))
        await asyncio.gather(quiet_ids, *floods)
        return len(admitted), await _queue_waits(client, quiet, quiet_ids.result())


def test_a_flooding_tenant_leaves_the_other_within_the_bound(fair_stack: Stack) -> None:
    url = fair_stack.redis_url
    quiet = issue_key(url, "quiet", "submit", "read", max_in_flight=1_000, **NO_LIMITS)
    capped = issue_key(url, "flood", "submit", "read", max_in_flight=CAP, **NO_LIMITS)
    uncapped = issue_key(url, "flood", "submit", "read", max_in_flight=1_000_000, **NO_LIMITS)

    flooded, fair = asyncio.run(_scenario(fair_stack.base_url, capped, quiet))
    unfair_flood, unfair = asyncio.run(
        _scenario(fair_stack.base_url, uncapped, quiet, CONTROL_FLOOD)
    )

    report = (
        f"capped flood ({flooded} jobs admitted): quiet p99 {_p99(fair):.0f} ms, second worst"
        f" {_second_worst(fair):.0f} ms, median"
        f" {sorted(fair)[len(fair) // 2]:.0f} ms over {len(fair)} jobs; uncapped flood"
        f" ({unfair_flood} jobs): quiet p99 {_p99(unfair):.0f} ms"
    )
    print(report)
    # The flood kept the partition busy: more jobs than one worker drains in the window.
    assert len(fair) >= 10 and flooded >= FLOOD_S * 1000 / BATCH_MS, report
    assert _second_worst(fair) < BOUND_MS, report
    assert _p99(unfair) > BOUND_MS, report


FAIR_FLOOD = 120  # 30 micro-batches of SHORT_MS: the backlog a quiet job must not wait out
SHORT_MS = 50
QUIET_JOBS = 8


async def _flood_then_quiet(
    base_url: str, model: str, flooder: str, quiet: str, flood_jobs: int = FAIR_FLOOD
) -> dict[str, Any]:
    """Submit `flood_jobs` at once, then QUIET_JOBS spaced quiet ones while they drain; the
    quiet jobs' queue waits and micro-batch sizes, and how long the flood took to drain, from
    the jobs' own timings."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def submit(key: str) -> str:
            body = _job(model, SHORT_MS)
            response = await client.post("/v1/jobs", json=body, headers={"X-API-Key": key})
            assert response.status_code == 202, response.text
            return str(response.json()["id"])

        flood = await asyncio.gather(*(submit(flooder) for _ in range(flood_jobs)))
        quiet_ids = []
        for _ in range(QUIET_JOBS):
            quiet_ids.append(await submit(quiet))
            await asyncio.sleep(SHORT_MS * 2 / 1000)
        quiet_jobs = await _succeeded(client, quiet, quiet_ids)
        response = await client.get(
            f"/v1/jobs/{flood[-1]}", params={"wait": 60}, headers={"X-API-Key": flooder}
        )
        last = response.json()["timings"]
    drain_ms = (last["finished"] - last["created"]) * 1000
    waits = [job["timings"]["queue_wait_ms"] for job in quiet_jobs]
    return {
        "waits": waits,
        "sizes": [job["batch_size"] for job in quiet_jobs],
        "drain_ms": drain_ms,
    }


def test_fair_queuing_lets_a_quiet_tenant_overtake_a_flood(fair_stack: Stack) -> None:
    if "budgeted" not in fair_stack.processes:  # the next test's, started beside this one's
        fair_stack.spawn_worker("budgeted")
    serve(fair_stack, "fair")
    serve(fair_stack, "budgeted")  # ready, and idle, before either scenario begins
    url = fair_stack.redis_url
    quiet = issue_key(url, "quiet", "submit", "read", max_in_flight=1_000, **NO_LIMITS)
    flooder = issue_key(url, "flood", "submit", "read", max_in_flight=1_000_000, **NO_LIMITS)

    fair = asyncio.run(_flood_then_quiet(fair_stack.base_url, "fair", flooder, quiet))
    fifo = asyncio.run(_flood_then_quiet(fair_stack.base_url, "slow", flooder, quiet))

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    report = (
        f"fair queuing on: quiet median {median(fair['waits']):.0f} ms, p99"
        f" {_p99(fair['waits']):.0f} ms, flood drained in {fair['drain_ms']:.0f} ms; off: quiet"
        f" median {median(fifo['waits']):.0f} ms, p99 {_p99(fifo['waits']):.0f} ms, flood"
        f" drained in {fifo['drain_ms']:.0f} ms"
    )
    print(report)
    # On: a quiet job waits for about one micro-batch, not for the flood's backlog.
    assert median(fair["waits"]) * 4 < fair["drain_ms"], report
    # Off (arrival order): quiet jobs queue behind the backlog, far longer than with it on.
    assert median(fifo["waits"]) > 2 * median(fair["waits"]), report


BUDGET_FLOOD = 40  # at one job a micro-batch, longer than the quiet tenant sends


def test_a_batch_budget_shrinks_micro_batches_while_tenants_compete(fair_stack: Stack) -> None:
    """`queue.fair_batch_ms`: the fault engine's calls take SHORT_MS whatever their size, over
    the `budgeted` model's 10 ms, so once round robin serves both tenants its micro-batches
    shrink to one job per tenant (a tenth fewer after each call over budget: 4, 3, 2), and a
    quiet job waits for a call of two jobs, not four. Without a budget (`fair`) they stay full."""
    serve(fair_stack, "fair")
    serve(fair_stack, "budgeted")
    url = fair_stack.redis_url
    quiet = issue_key(url, "quiet", "submit", "read", max_in_flight=1_000, **NO_LIMITS)
    flooder = issue_key(url, "flood", "submit", "read", max_in_flight=1_000_000, **NO_LIMITS)

    base = fair_stack.base_url
    budgeted = asyncio.run(_flood_then_quiet(base, "budgeted", flooder, quiet, BUDGET_FLOOD))
    full = asyncio.run(_flood_then_quiet(base, "fair", flooder, quiet, BUDGET_FLOOD))

    report = f"quiet jobs' micro-batch sizes: budgeted {budgeted['sizes']}, fair {full['sizes']}"
    print(report)
    # two calls over budget after both tenants were seen bring the cap to two, one job of each
    # tenant; the fifth quiet job comes 400 ms after the first, which met the flood
    assert max(budgeted["sizes"][4:]) <= 2, report
    # without a budget a quiet job shares a full micro-batch with the flood's jobs
    assert max(full["sizes"]) > 2, report
