"""Stack-free: when a canary must roll back. The error-rate rule runs end to end in
tests/test_canary.py (a flaky variant); the latency rule, a canary slower than its bound, is
the one no stack test drives, so both are pinned here on the decision itself, with the window
a decision reads (on a real Valkey)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from conveyor.commands.canary import print_canary
from producer_api.canary.controller import LONGEST_LOOK_S, CanaryController, breach
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore, VersionConflict
from shared.routing import Routes
from shared.stats_window import BUCKET_S, bucket_of
from shared.variant_stats import Sample, VariantStats, Window
from shared.webhook_events import WebhookDispatcher
from tests.conftest import REPO_ROOT

CANARY = Canary(
    model="ab",
    variant="candidate",
    baseline="stable",
    steps=[50, 100],
    interval_s=30,
    max_error_rate=0.05,
    max_p99_ms=750,
    min_requests=40,
)
TRAFFIC = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
BASELINE = {"requests": 100, "errors": 1, "error_rate": 0.01, "p99_ms": 120.0}


def _numbers(error_rate: float, p99_ms: float | None) -> dict[str, Any]:
    return {"requests": 100, "errors": int(error_rate * 100), "error_rate": error_rate,
            "p99_ms": p99_ms}  # fmt: skip


@pytest.mark.parametrize(
    ("error_rate", "p99_ms"),
    [(0.01, 120.0), (0.06, 750.0), (0.0, None)],  # as the baseline; both at their bounds; idle
)
def test_a_canary_within_its_bounds_stays(error_rate: float, p99_ms: float | None) -> None:
    assert breach(CANARY, _numbers(error_rate, p99_ms), BASELINE) is None


def test_errors_beyond_the_baselines_by_more_than_the_bound_roll_back() -> None:
    reason = breach(CANARY, _numbers(0.07, 120.0), BASELINE)
    assert reason == "error rate 0.0700 exceeds the baseline's 0.0100 by more than 0.05"


def test_a_p99_above_the_bound_rolls_back_even_without_errors() -> None:
    reason = breach(CANARY, _numbers(0.0, 750.5), BASELINE)
    assert reason == "p99 750.5 ms is above 750 ms"


def test_a_baseline_with_too_few_requests_is_no_reference() -> None:
    """At 100 % the baseline's window holds a few leftover jobs: one failure among 14 made its
    error rate 7 %, and a canary failing 8 % completed. Below `min_requests` the canary is held
    to `max_error_rate` itself."""
    strict = replace(CANARY, max_error_rate=0.01)
    mine = {"requests": 200, "errors": 16, "error_rate": 0.08, "p99_ms": 100.0}
    leftovers = {"requests": 14, "errors": 1, "error_rate": round(1 / 14, 6), "p99_ms": 90.0}
    reason = breach(strict, mine, leftovers)
    assert reason == (
        "error rate 0.0800 exceeds 0 (the baseline's 14 requests are fewer than min_requests 40)"
        " by more than 0.01"
    )
    assert breach(strict, mine | {"errors": 2, "error_rate": 0.01}, leftovers) is None


@pytest.mark.parametrize(
    ("earlier_errors", "canary_errors", "state"),
    [(0, 16, "rolled_back"), (50, 10, "completed")],
)
async def test_at_100_percent_the_baseline_is_taken_over_the_whole_canary(
    aredis: aioredis.Redis, earlier_errors: int, canary_errors: int, state: str
) -> None:
    """The last step's baseline window held 14 leftover jobs, one failed: a canary failing 8 %
    completed against its 7 %. Its 1 000 jobs of the earlier steps are the reference (0.1 %:
    rolled back); and a baseline that always fails 5 % does not roll back a canary failing 5 %,
    as holding it to `max_error_rate` alone would."""
    keys = Keys("canary-base:")
    store, stats = CanaryStore(aredis, keys), _WindowsAsked(aredis, keys)
    await RouteStore(aredis, keys).seed("ab", Routes({"stable": 0.0, "candidate": 100.0}))
    bucket = bucket_of(time.time())
    canary = replace(CANARY, max_error_rate=0.01, interval_s=1.0, step=1, weight=100.0)
    canary.started_at, canary.step_started_at = (bucket - 5) * BUCKET_S, (bucket - 1) * BUCKET_S
    assert await store.start(canary)
    earlier = f"{keys.variant_stats('ab', 'stable')}{bucket - 3}"  # the 50 % step's bucket
    await aredis.hset(earlier, mapping={"requests": 1000, "errors": earlier_errors})
    leftovers = [Sample(n > 0, 1.0, 1.0) for n in range(14)]
    candidate = [Sample(n >= canary_errors, 1.0, 1.0) for n in range(200)]
    await stats.record_samples({("ab", "stable"): leftovers, ("ab", "candidate"): candidate})
    await _controller(aredis, keys, stats).decide(canary)
    assert canary.state == state
    last = (await store.events("ab", 1))[-1]
    assert last["numbers"]["baseline"]["requests"] == 1014
    assert stats.sampled[-1] == 0  # the whole canary's baseline: counters, never its samples


def _controller(
    client: aioredis.Redis, keys: Keys, stats: VariantStats, models: ModelRepository | None = None
) -> CanaryController:
    return CanaryController(
        CanaryStore(client, keys),
        RouteStore(client, keys),
        stats,
        models or ModelRepository({}),
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )


class _WindowsAsked(VariantStats):
    """Real statistics on Valkey that note where each window asked for began, which variants
    it asked for with or without samples, and how many latency samples it gave."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        super().__init__(client, keys)
        self.since: list[float] = []
        self.asked: list[tuple[str, bool]] = []
        self.sampled: list[int] = []

    async def window(
        self,
        model: str,
        variants: Iterable[str],
        since_s: float,
        until_s: float | None = None,
        samples: bool = True,
    ) -> dict[str, Window]:
        self.since.append(since_s)
        names = list(variants)
        self.asked += [(name, samples) for name in names]
        windows = await super().window(model, names, since_s, until_s, samples)
        self.sampled.append(sum(len(window.samples) for window in windows.values()))
        return windows


async def _at_step_0(client: aioredis.Redis, keys: Keys, **changes: Any) -> Canary:
    """CANARY at its first step (50 %), as the live routes have it."""
    await RouteStore(client, keys).seed("ab", Routes({"stable": 50.0, "candidate": 50.0}))
    return replace(CANARY, step=0, weight=50.0, **changes)


async def test_a_look_that_decides_nothing_reads_no_baseline_samples(
    aredis: aioredis.Redis,
) -> None:
    """Every look (twice a second) read up to WINDOW_SAMPLES latency samples of the baseline,
    though `breach` reads only its error rate: its p99 is shown in a decision's event alone.
    A look that decides nothing reads the baseline's counters; a decision reads its samples."""
    keys = Keys("canary-lazy:")
    stats = _WindowsAsked(aredis, keys)
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = await _at_step_0(aredis, keys, interval_s=3600.0, step_started_at=began)
    healthy = [Sample(True, 1.0, 1.0)] * CANARY.min_requests
    await stats.record_samples({("ab", "stable"): healthy, ("ab", "candidate"): healthy})
    controller = _controller(aredis, keys, stats)

    await controller.decide(canary)
    assert (canary.state, canary.step) == ("running", 0)  # within its interval: no decision
    assert ("stable", False) in stats.asked and ("stable", True) not in stats.asked
    assert ("candidate", True) in stats.asked  # its own p99 is a bound

    canary.interval_s = 1.0
    await controller.decide(canary)
    assert (canary.state, canary.step) == ("running", 1)
    shown = (await CanaryStore(aredis, keys).events("ab", 1))[-1]["numbers"]["baseline"]
    assert shown["requests"] == CANARY.min_requests and shown["p99_ms"] == 2.0


async def test_a_long_step_reads_a_bounded_window(aredis: aioredis.Redis) -> None:
    """Every look read the step's whole window: a step that began 3 days ago (its canary short
    of `min_requests`, within a `max_step_s` of a week) summed some 26 000 buckets per variant
    twice a second."""
    keys = Keys("canary-cap:")
    stats = _WindowsAsked(aredis, keys)
    began = time.time() - 3 * 86_400
    canary = await _at_step_0(aredis, keys, step_started_at=began, max_step_s=7 * 86_400.0)
    before = time.time()
    await _controller(aredis, keys, stats).decide(canary)
    assert stats.since and min(stats.since) >= before - LONGEST_LOOK_S
    assert (canary.state, canary.step) == ("running", 0)  # short of min_requests: waits


async def test_a_step_short_of_min_requests_past_its_bound_rolls_back(
    aredis: aioredis.Redis,
) -> None:
    """A candidate whose workers never take a job (no Deployment, an image that won't pull, an
    engine that won't load) had its step's share of jobs wait in its lane: nothing was ever
    counted, and the step waited for `min_requests` for ever. Past `max_step_s` (by default
    5 intervals here) it rolls back."""
    keys = Keys("canary-stuck:")
    bound = 5 * CANARY.interval_s
    canary = await _at_step_0(aredis, keys, step_started_at=time.time() - bound - 5)
    await _controller(aredis, keys, VariantStats(aredis, keys)).decide(canary)
    assert (canary.state, canary.weight) == ("rolled_back", 0.0)
    live = (await RouteStore(aredis, keys).get_many(["ab"]))["ab"]
    assert live.weights == {"stable": 100.0, "candidate": 0.0}, live
    reason = (await CanaryStore(aredis, keys).events("ab", 1))[-1]["reason"]
    assert "0 requests" in reason and f"max_step_s {bound:g}" in reason, reason


async def test_a_routes_change_during_a_canary_aborts_it(aredis: aioredis.Redis) -> None:
    """An operator's PUT of the routes (candidate 0 %) during a step was answered 200, then
    written over by the canary's next step: the canary stops and the operator's routes stay."""
    keys = Keys("canary-operator:")
    bucket = bucket_of(time.time())
    began = (bucket - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = await _at_step_0(aredis, keys, interval_s=1.0, step_started_at=began)
    routes = RouteStore(aredis, keys)
    await routes.put("ab", Routes({"stable": 100.0, "candidate": 0.0}), "operator")
    healthy = [Sample(True, 1.0, 1.0)] * CANARY.min_requests
    both = {("ab", "stable"): healthy, ("ab", "candidate"): healthy}
    await VariantStats(aredis, keys).record_samples(both)
    await _controller(aredis, keys, VariantStats(aredis, keys)).decide(canary)
    live = (await routes.get_many(["ab"]))["ab"]
    assert live.weights == {"stable": 100.0, "candidate": 0.0}, live
    assert (canary.state, canary.weight) == ("aborted", 0.0)
    reason = (await CanaryStore(aredis, keys).events("ab", 1))[-1]["reason"]
    assert "routes changed" in reason, reason


async def test_a_canary_steps_the_routes_producers_serve(aredis: aioredis.Redis) -> None:
    """Stored routes weighing a variant a redeploy removed are ignored (config.yaml's apply): the
    first step scaled them and stayed ignored, its 5 % never served until it starved and rolled
    back. It scales config.yaml's, which producers then serve as stored."""
    keys = Keys("canary-ignored:")
    routes = RouteStore(aredis, keys)
    await routes.seed("ab", Routes({"stable": 90.0, "gone": 10.0}))
    canary = replace(CANARY, steps=[5.0, 100.0])
    await _controller(aredis, keys, VariantStats(aredis, keys), TRAFFIC).decide(canary)
    served, adjusted = await routes.served(TRAFFIC.models["ab"])
    assert (served.weights, adjusted) == ({"stable": 95.0, "candidate": 5.0, "flaky": 0.0}, None)


async def test_a_canary_whose_variant_config_yaml_dropped_ends(aredis: aioredis.Redis) -> None:
    """Redeployed without `candidate`, producers served config.yaml's routes, yet its canary
    stepped on (to 100 %, then `completed`) on the counts its step had before: it is aborted,
    the routes left as they are."""
    keys = Keys("canary-dropped:")
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = await _at_step_0(aredis, keys, interval_s=1.0, step_started_at=began)
    healthy = [Sample(True, 1.0, 1.0)] * CANARY.min_requests
    stats = VariantStats(aredis, keys)
    await stats.record_samples({("ab", "stable"): healthy, ("ab", "candidate"): healthy})
    ab = TRAFFIC.models["ab"]
    variants = {name: v for name, v in ab.variants.items() if name != "candidate"}
    redeployed = ModelRepository({"ab": ab.model_copy(update={"variants": variants})})
    await _controller(aredis, keys, stats, redeployed).decide(canary)
    assert (canary.state, canary.weight) == ("aborted", 50.0)
    live = (await RouteStore(aredis, keys).get_many(["ab"]))["ab"]
    assert live.weights == {"stable": 50.0, "candidate": 50.0}, live
    reason = (await CanaryStore(aredis, keys).events("ab", 1))[-1]["reason"]
    leader = "its variant cannot serve by the leading producer's config.yaml"
    assert reason == f'{leader}: model ab has no variant "candidate"', reason


class _RoutesSetMidDecision(VariantStats):
    """Real statistics on Valkey whose first window read lands an operator's routes change
    first: it comes while a decision awaits its windows, after it judged the live routes."""

    def __init__(self, client: aioredis.Redis, keys: Keys, routes: Routes) -> None:
        super().__init__(client, keys)
        self.route_store = RouteStore(client, keys)
        self.pending: Routes | None = routes

    async def window(
        self,
        model: str,
        variants: Iterable[str],
        since_s: float,
        until_s: float | None = None,
        samples: bool = True,
    ) -> dict[str, Window]:
        if self.pending is not None:
            routes, self.pending = self.pending, None
            await self.route_store.put(model, routes, "operator")
        return await super().window(model, variants, since_s, until_s, samples)


async def test_a_routes_change_while_a_step_is_decided_aborts_it(aredis: aioredis.Redis) -> None:
    """An operator's PUT (candidate 0 %) landing after a look judged the live routes, while it
    read its windows, was read over by the step it then took: scaled from and written at the
    new version, the rollback undone, no abort. The step is refused, and the next look aborts
    the canary, the operator's routes left as they are."""
    keys = Keys("canary-mid-decision:")
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = await _at_step_0(aredis, keys, interval_s=1.0, step_started_at=began)
    store = CanaryStore(aredis, keys)
    assert await store.start(canary)
    healthy = [Sample(True, 1.0, 1.0)] * CANARY.min_requests
    both = {("ab", "stable"): healthy, ("ab", "candidate"): healthy}
    await VariantStats(aredis, keys).record_samples(both)
    operator = Routes({"stable": 100.0, "candidate": 0.0})
    controller = _controller(aredis, keys, _RoutesSetMidDecision(aredis, keys, operator))

    with contextlib.suppress(VersionConflict):  # the look's "deciding again"
        await controller.decide(canary)
    stored = await store.get("ab")
    assert stored is not None
    await controller.decide(stored)
    live = (await RouteStore(aredis, keys).get_many(["ab"]))["ab"]
    assert live.weights == operator.weights, live
    assert (stored.state, stored.weight) == ("aborted", 0.0)
    reason = (await store.events("ab", 1))[-1]["reason"]
    assert "routes changed" in reason, reason


async def test_the_bulk_lanes_waits_are_left_out_of_the_p99(aredis: aioredis.Redis) -> None:
    """Batch API items follow the live routes into the canary's bulk lane, where they wait
    behind online work by design: three of them, a minute each, took a healthy canary's p99 past
    `max_p99_ms`, and it rolled back. The p99 is its online jobs'; bulk ones still count as
    requests."""
    keys = Keys("canary-bulk:")
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in the step's window
    canary = await _at_step_0(aredis, keys, interval_s=1.0, step_started_at=began)
    online = [Sample(True, 1.0, 10.0)] * 200
    bulk = [Sample(True, 60_000.0, 10.0, bulk=True)] * 3
    both = {("ab", "stable"): online, ("ab", "candidate"): online + bulk}
    await VariantStats(aredis, keys).record_samples(both)
    await _controller(aredis, keys, VariantStats(aredis, keys)).decide(canary)
    assert (canary.state, canary.step) == ("running", 1)  # on to the next step
    numbers = (await CanaryStore(aredis, keys).events("ab", 1))[-1]["numbers"]["canary"]
    assert numbers["requests"] == 203 and numbers["p99_ms"] == 11.0, numbers


def test_a_samples_lane_survives_its_encoding() -> None:
    for sample in (Sample(True, 1.5, 2.0), Sample(False, 60_000.0, 3.0, bulk=True)):
        assert Sample.decode(sample.encode()) == sample
    assert Sample.decode("1,2.000,3.000") == Sample(True, 2.0, 3.0)  # stored before lanes


async def test_a_step_whose_record_was_lost_is_taken_up_not_aborted(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step writes the routes, then the canary's record: a save that failed in between (a
    Redis error, a leader that died) left routes the record did not know, and the next look
    aborted the canary as if an operator had changed them, its candidate left at the new share
    with nothing watching it. Routes the canary itself wrote last are taken up instead."""
    keys = Keys("canary-lost-save:")
    began = (bucket_of(time.time()) - 1) * BUCKET_S
    canary = await _at_step_0(aredis, keys, interval_s=1.0, step_started_at=began)
    store = CanaryStore(aredis, keys)
    assert await store.start(canary)
    healthy = [Sample(True, 1.0, 1.0)] * CANARY.min_requests
    both = {("ab", "stable"): healthy, ("ab", "candidate"): healthy}
    await VariantStats(aredis, keys).record_samples(both)
    saved = CanaryStore.save

    async def lost(*_: object) -> None:
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(CanaryStore, "save", lost)
    with pytest.raises(redis.ConnectionError):
        await _controller(aredis, keys, VariantStats(aredis, keys)).decide(canary)
    monkeypatch.setattr(CanaryStore, "save", saved)
    stored = await store.get("ab")
    assert stored is not None and stored.step == 0  # the routes moved on, the record did not
    await _controller(aredis, keys, VariantStats(aredis, keys)).decide(stored)
    assert (stored.state, stored.step, stored.weight) == ("running", 1, 100.0)
    live = (await RouteStore(aredis, keys).get_many(["ab"]))["ab"]
    assert live.weights["candidate"] == 100.0


async def test_a_step_taken_up_after_its_record_was_lost_is_announced(
    aredis: aioredis.Redis,
) -> None:
    """A step's routes written, its record's save lost before its announcement: the next look
    took the step up silently, with no `step` event and no `model.canary.step` webhook, though
    every decision is one."""
    keys = Keys("canary-lost-event:")
    routes = RouteStore(aredis, keys)
    await routes.seed("ab", Routes({"stable": 95.0, "candidate": 5.0}))
    canary = replace(CANARY, steps=[5, 25, 50, 100], step=0, weight=5.0)
    canary.step_started_at = time.time()
    store = CanaryStore(aredis, keys)
    assert await store.start(canary)
    await routes.put("ab", Routes({"stable": 75.0, "candidate": 25.0}), "canary:candidate")

    await _controller(aredis, keys, VariantStats(aredis, keys)).look()

    stored = await store.get("ab")
    assert stored is not None and (stored.state, stored.step, stored.weight) == ("running", 1, 25)
    events = await store.events("ab")
    assert [(e["type"], e["weight"]) for e in events] == [("step", 25.0)], events
    assert events[-1]["reason"] == "taken up: its record was lost"


async def test_routes_that_give_the_canary_minus_zero_abort_it_at_zero(
    aredis: aioredis.Redis,
) -> None:
    """Routes an operator wrote with the canary's variant at -0.0 (JSON's `-0.0`, which the
    routes API takes as not negative) aborted the canary at -0.0: its record, its event (and
    reason, "-0 %") and its gauge said -0."""
    keys = Keys("canary-minus-zero:")
    routes = RouteStore(aredis, keys)
    await routes.seed("ab", Routes({"stable": 95.0, "candidate": 5.0}))
    canary = replace(CANARY, steps=[5, 25, 100], step=0, weight=5.0)
    canary.step_started_at = time.time()
    store = CanaryStore(aredis, keys)
    assert await store.start(canary)
    await routes.put("ab", Routes({"stable": 100.0, "candidate": -0.0}), "operator")

    await _controller(aredis, keys, VariantStats(aredis, keys)).look()

    stored = await store.get("ab")
    (event,) = await store.events("ab")
    assert stored is not None and (stored.state, event["type"]) == ("aborted", "aborted")
    gauged = REGISTRY.get_sample_value(
        "conveyor_canary_weight", {"model": "ab", "variant": "candidate"}
    )
    for weight in (stored.weight, event["weight"], gauged):
        assert weight == 0 and math.copysign(1, weight) == 1, (stored, event, gauged)
    assert "candidate has 0 %, not its step's 5 %" in event["reason"], event


def test_status_shows_as_many_decisions_as_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--events 0` printed every decision (`[-0:]` is the whole list)."""
    canary = {"model": "ab", "variant": "c", "baseline": "s", "state": "running", "weight": 5.0}
    canary |= {"steps": [5.0, 100.0], "started_at": 100.0}
    events = [{"at": 100.0 + n, "type": "step", "weight": 5.0} for n in range(3)]
    for shown, lines in ((0, 1), (2, 3), (10, 4)):
        print_canary({"canary": canary, "events": events}, shown)
        assert len(capsys.readouterr().out.splitlines()) == lines, shown
