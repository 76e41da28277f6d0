"""A canary's start, its abort and the traffic leader's decisions take turns, on a real Valkey
without a stack. An abort that landed while the leader was moving the same canary a step used to
be written over: the leader had read the canary running, and its step wrote `running` and its
weight back after the abort had answered 200 `aborted`. And a leader's look between a start and
its `started` event put the first step before it. The stack's side of canaries (HTTP, CLI,
gauges) is `tests/test_canary.py`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.variant_stats import Sample, VariantStats
from shared.webhook_events import WebhookDispatcher
from tests.conftest import REPO_ROOT

KEYS = Keys("canary-race:")
TRAFFIC = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
MODEL = "ab"


class _Producer(CanaryController):
    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(
            CanaryStore(client, KEYS),
            RouteStore(client, KEYS),
            VariantStats(client, KEYS),
            ModelRepository({}),
            WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
        )


class _HeldDecision(_Producer):
    """The leader, holding each decision open until the gate opens (a slow stats read)."""

    def __init__(self, client: aioredis.Redis, gate: asyncio.Event) -> None:
        super().__init__(client)
        self.gate = gate
        self.deciding = asyncio.Event()

    async def decide(self, canary: Canary) -> None:
        self.deciding.set()
        await self.gate.wait()
        await super().decide(canary)


class _LookedAtWhileStarting(_Producer):
    """A producer starting a canary, whose telling of its `started` event (its log and webhook,
    after the start's script) meets the leader's look: the event must be on record by then."""

    def __init__(self, client: aioredis.Redis, leader: CanaryController) -> None:
        super().__init__(client)
        self.leader = leader

    async def _tell(self, canary: Canary, kind: str, record: dict[str, Any]) -> None:
        if kind == "started":
            await self.leader.look()
        await super()._tell(canary, kind, record)


def _canary() -> Canary:
    return Canary(
        model=MODEL,
        variant="candidate",
        baseline="stable",
        steps=[10.0, 50.0, 100.0],
        interval_s=60.0,
        max_error_rate=0.05,
        max_p99_ms=1_000.0,
        min_requests=10,
    )


async def test_an_abort_during_a_decision_is_not_undone_by_it(aredis: aioredis.Redis) -> None:
    gate = asyncio.Event()
    leader = _HeldDecision(aredis, gate)
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())

    looking = asyncio.create_task(leader.look())  # its first decision: step 0, 10 %
    await asyncio.wait_for(leader.deciding.wait(), timeout=10)
    other_producer = _HeldDecision(aredis, asyncio.Event())
    aborting = asyncio.create_task(other_producer.abort(MODEL, "aborted by the test"))
    await asyncio.sleep(0.3)  # the abort has had time to act, were it not waiting
    gate.set()
    await looking

    assert await aborting is True
    canary = await store.get(MODEL)
    assert canary is not None and (canary.state, canary.weight) == ("aborted", 0.0), canary
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights["candidate"] == 0.0 and live.weights["stable"] == 100.0, live
    assert await store.active() == []
    kinds = [event["type"] for event in await store.events(MODEL, 10)]
    assert kinds == ["step", "aborted"], kinds  # the step happened, then the abort ended it
    assert await other_producer.abort(MODEL, "again") is False


async def test_the_leader_passes_over_a_canary_an_abort_holds(aredis: aioredis.Redis) -> None:
    """While an abort holds the lock, the leader's look leaves the canary alone (no step)."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    leader = _HeldDecision(aredis, asyncio.Event())
    leader.gate.set()
    async with store.lock(MODEL, wait_s=1.0):
        await leader.look()
        held = await store.get(MODEL)
        assert held is not None and (held.step, held.weight) == (-1, 0.0), held
    await leader.look()
    moved = await store.get(MODEL)
    assert moved is not None and (moved.step, moved.weight) == (0, 10.0), moved


async def test_the_leaders_first_step_comes_after_the_started_event(
    aredis: aioredis.Redis,
) -> None:
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    leader = _Producer(aredis)
    assert await _LookedAtWhileStarting(aredis, leader).start(_canary())
    assert [event["type"] for event in await store.events(MODEL, 10)] == ["started"]
    await leader.look()
    assert [event["type"] for event in await store.events(MODEL, 10)] == ["started", "step"]
    assert await leader.start(_canary()) is False  # one runs already


async def test_a_rollback_from_100_percent_hands_traffic_back_in_the_ratios_before(
    aredis: aioredis.Redis,
) -> None:
    """At 100 % every other primary has weight 0; a rollback used to give everything to the
    first variant listed (here `flaky`, which had none), not back to stable and other."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    split = {"flaky": 0.0, "stable": 70.0, "other": 30.0, "candidate": 0.0}
    await routes.seed(MODEL, Routes(split))
    assert await store.start(replace(_canary(), steps=[100.0]))
    leader = _Producer(aredis)
    await leader.look()
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {**dict.fromkeys(split, 0.0), "candidate": 100.0}, live
    assert await leader.abort(MODEL, "aborted by the test")
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == pytest.approx(split), live


async def test_a_rollback_with_no_other_variant_served_goes_to_the_baseline(
    aredis: aioredis.Redis,
) -> None:
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"flaky": 0.0, "candidate": 100.0}))
    assert await store.start(_canary())  # its baseline: stable, absent from the routes
    leader = _Producer(aredis)
    await leader.look()
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"flaky": 0.0, "candidate": 10.0, "stable": 90.0}, live
    assert await leader.abort(MODEL, "aborted by the test")
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"flaky": 0.0, "candidate": 0.0, "stable": 100.0}, live


async def test_a_canary_of_a_shadowed_variant_takes_it_out_of_the_shadows(
    aredis: aioredis.Redis,
) -> None:
    """Shadow first, then canary: the step used to store the variant serving 10 % and still
    shadowing, routes every producer refuses to serve (it then fell back to config.yaml's
    split, and the canary saw no requests for ever)."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}, {"candidate": 0.5}))
    assert await store.start(_canary())
    await _Producer(aredis).look()
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"stable": 90.0, "candidate": 10.0}, live
    assert live.shadows == {}, live


async def test_a_rollback_from_100_percent_stops_shadowing_the_variant_it_serves_again(
    aredis: aioredis.Redis,
) -> None:
    """At 100 % an operator shadows the old baseline (weight 0 now, the canary's share kept, so
    the canary goes on): a rollback or an abort handed it its traffic back and left it
    shadowing too, routes every producer refused to serve (they fell back to config.yaml's)."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(replace(_canary(), steps=[100.0]))
    leader = _Producer(aredis)
    await leader.look()
    served = (await routes.get_many([MODEL]))[MODEL]
    assert served.weights == {"stable": 0.0, "candidate": 100.0}, served
    shadowed = Routes(served.weights, {"stable": 1.0})
    await routes.put(MODEL, shadowed, "operator", served.version)
    await leader.look()  # the canary's weight is as it was: it goes on
    running = await store.get(MODEL)
    assert running is not None and (running.state, running.weight) == ("running", 100.0), running
    assert await leader.abort(MODEL, "aborted by the test")
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"stable": 100.0, "candidate": 0.0}, live
    assert live.shadows == {}, live
    live.check(TRAFFIC.models[MODEL])  # routes producers serve as stored


class _OperatorFirst(RouteStore):
    """Routes whose first canary write finds an operator's change landed since its read."""

    raced = False

    async def put(
        self,
        model: str,
        routes: Routes,
        by: str,
        expected: int | None = None,
        lease: LeaderLock | None = None,
    ) -> int:
        if by.startswith("canary:") and not self.raced:
            self.raced = True
            await super().put(model, Routes({"stable": 80.0, "candidate": 20.0}), "operator")
        return await super().put(model, routes, by, expected, lease)


class _RacedByAnOperator(_Producer):
    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(client)
        self.routes = _OperatorFirst(client, KEYS)


async def test_an_abort_that_meets_a_routes_change_reads_them_again(
    aredis: aioredis.Redis,
) -> None:
    """The abort's conditional write lost to the operator's PUT and answered 500."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    await _Producer(aredis).look()  # 10 %
    producer = _RacedByAnOperator(aredis)
    assert await producer.abort(MODEL, "aborted by the test")
    assert isinstance(producer.routes, _OperatorFirst) and producer.routes.raced
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"stable": 100.0, "candidate": 0.0}, live
    canary = await store.get(MODEL)
    assert canary is not None and (canary.state, canary.weight) == ("aborted", 0.0), canary


async def test_one_models_failing_canary_does_not_stop_the_others(
    aredis: aioredis.Redis,
) -> None:
    """`aa`'s stored routes are no JSON (reading them raises): its error used to end the look
    before `ab`, which then never moved."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    await aredis.hset(KEYS.routes("aa"), mapping={"doc": "{not json", "version": 1})
    assert await store.start(replace(_canary(), model="aa"))
    assert await store.start(_canary())
    await _Producer(aredis).look()
    moved = await store.get(MODEL)
    assert moved is not None and (moved.step, moved.weight) == (0, 10.0), moved
    stuck = await store.get("aa")
    assert stuck is not None and (stuck.state, stuck.step) == ("running", -1), stuck
    await aredis.delete(KEYS.routes("aa"))


async def test_a_step_is_judged_on_its_own_requests_only(aredis: aioredis.Redis) -> None:
    """The window began with the 10 s bucket the step began in: the last step's requests
    counted toward this one's min_requests, and it could step on evidence it never had."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    canary = replace(_canary(), min_requests=5, interval_s=0.0)
    assert await store.start(canary)
    leader = _Producer(aredis)
    await leader.look()  # step 0
    before = [Sample(True, 1.0, 1.0)] * 5  # the last step's requests, in this bucket
    await VariantStats(aredis, KEYS).record_samples({(MODEL, "candidate"): before})
    stepped = await store.get(MODEL)
    assert stepped is not None
    stepped.step_started_at = time.time()  # the next step begins just after them
    await store.save(stepped)
    await leader.look()
    judged = await store.get(MODEL)
    assert judged is not None and (judged.step, judged.weight) == (0, 10.0), judged


class _RefusingBroker(WebhookDispatcher):
    """Celery's broker down: every hand-over of an event raises."""

    def send(self, *_: Any) -> None:
        raise RuntimeError("broker unreachable")


async def test_a_refused_webhook_fails_neither_a_start_nor_an_abort(
    aredis: aioredis.Redis,
) -> None:
    """The event was sent after the canary was stored: a broker that refused it made the start
    (or the abort) answer 500 for a canary it had started (or ended)."""
    store, routes = CanaryStore(aredis, KEYS), RouteStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    controller = CanaryController(
        store, routes, VariantStats(aredis, KEYS), ModelRepository({}), _RefusingBroker("x")
    )
    assert await controller.start(replace(_canary(), webhook="https://hooks.example.com/c"))
    assert await controller.abort(MODEL, "aborted by the test")
    canary = await store.get(MODEL)
    assert canary is not None and canary.state == "aborted"
    assert [event["type"] for event in await store.events(MODEL, 10)] == ["started", "aborted"]


async def test_a_canary_whose_model_left_with_its_routes_ends_aborted(
    aredis: aioredis.Redis,
) -> None:
    """A model gone from config.yaml (this producer's repository holds none) whose stored routes
    went too: every look raised KeyError reading them, and the canary ran on for ever."""
    store = CanaryStore(aredis, KEYS)
    await aredis.delete(KEYS.routes(MODEL))
    assert await store.start(_canary())
    await _Producer(aredis).look()
    ended = await store.get(MODEL)
    assert ended is not None and (ended.state, ended.weight) == ("aborted", 0.0), ended
    [event] = [e for e in await store.events(MODEL, 10) if e["type"] == "aborted"]
    assert "neither in the model repository nor has stored routes" in event["reason"], event
