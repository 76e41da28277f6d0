"""Canary fixes of round 23, on a real Valkey without a stack: the CLI holds `--steps`,
`--interval` and `--max-step` to the producer's rules (shared/canary_steps.py); an abort or a
decision whose save Redis refused (a user whose ACL denies the key: a real refusal, not a mocked
one) is taken up as what it was, its event kept; and a step of Batch API items waits for its
p99 to be judged instead of stepping on unjudged."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis
from click.testing import CliRunner
from redis.exceptions import NoPermissionError

from conveyor.cli import main
from producer_api.canary.controller import CanaryController
from shared.canary_store import Canary, CanaryStore
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.stats_window import BUCKET_S, bucket_of
from shared.variant_stats import Sample, VariantStats
from shared.webhook_events import WebhookDispatcher

KEYS = Keys("canary-r23:")
MODEL = "ab"
NOWHERE = ("--url", "http://127.0.0.1:9")  # nothing listens: a call made fails as an outage


def _canary(**changes: Any) -> Canary:
    canary = Canary(MODEL, "candidate", "stable", [10.0, 50.0, 100.0], 60.0, 0.05, 750.0, 40)
    return replace(canary, **changes)


def _controller(client: aioredis.Redis, store: CanaryStore | None = None) -> CanaryController:
    return CanaryController(
        store or CanaryStore(client, KEYS),
        RouteStore(client, KEYS),
        VariantStats(client, KEYS),
        ModelRepository({}),  # the stored routes are the live ones
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )


@asynccontextmanager
async def _restricted(
    aredis: aioredis.Redis, redis_url: str, read_only: str
) -> AsyncIterator[aioredis.Redis]:
    """A client whose ACL lets it read but not write the key `read_only`, and use every other
    key a canary's decision or abort touches: Redis refuses the save that writes it."""
    user = f"canary-r23-{uuid.uuid4().hex[:8]}"
    writable = [
        KEYS.canary(MODEL),
        KEYS.canary_events(MODEL),
        KEYS.canary_lock(MODEL),
        KEYS.canaries_active,
        f"{KEYS.routes(MODEL)}*",  # its hash and log
        KEYS.routes_version,
    ]
    patterns = [f"~{key}" for key in writable if key != read_only]
    await aredis.execute_command(
        "ACL", "SETUSER", user, "on", "nopass", "+@all", *patterns, f"%R~{read_only}"
    )
    client = aioredis.Redis.from_url(redis_url, username=user, password="unused")
    try:
        yield client
    finally:
        await client.aclose()
        await aredis.execute_command("ACL", "DELUSER", user)


@pytest.mark.parametrize("value", ["5,5.0000005,100", "5e-7,100"])
def test_steps_too_close_to_move_the_weight_are_a_usage_error(value: str) -> None:
    """The producer refuses steps within 1e-6 % of the one before (0 before the first); the
    CLI sent them, and with the producer down the refusal read as an outage (exit 1)."""
    result = CliRunner().invoke(
        main, ["canary", "start", MODEL, "candidate", "--steps", value, *NOWHERE]
    )

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--steps': '{value}'" in result.output
    assert "within 1e-06 %" in result.output, result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--interval", "0s", "more than 0 s and at most 86400 s"),
        ("--interval", "48h", "more than 0 s and at most 86400 s"),
        ("--max-step", "10s", "at least 30 s and at most 604800 s"),
        ("--max-step", "200h", "at least 30 s and at most 604800 s"),
    ],
)
def test_durations_out_of_the_producers_bounds_are_a_usage_error(
    option: str, value: str, words: str
) -> None:
    """`interval_s` and `max_step_s` the producer refuses (422) went to it: exit 1, an outage's
    "cannot reach" while it was down."""
    result = CliRunner().invoke(
        main, ["canary", "start", MODEL, "candidate", option, value, *NOWHERE]
    )

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': '{value}': {words}" in result.output, result.output


async def test_an_abort_whose_save_was_refused_is_taken_up_as_an_abort(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The abort wrote the routes back to 0 %, then Redis refused its record's save: the next
    look took those routes for the canary's own rollback and recorded it `rolled_back`."""
    routes, store = RouteStore(aredis, KEYS), CanaryStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    leader = _controller(aredis)
    await leader.look()  # the first step: 10 %
    async with _restricted(aredis, redis_url, KEYS.canary(MODEL)) as refused:
        with pytest.raises(NoPermissionError):
            await _controller(refused).abort(MODEL, "aborted by the test")
    lost = await store.get(MODEL)
    assert lost is not None and (lost.state, lost.weight) == ("running", 10.0), lost

    await leader.look()

    ended = await store.get(MODEL)
    assert ended is not None and (ended.state, ended.weight) == ("aborted", 0.0), ended
    last = (await store.events(MODEL, 1))[-1]
    assert (last["type"], last["reason"]) == ("aborted", "its abort's record was lost"), last
    live = (await routes.get_many([MODEL]))[MODEL]
    assert live.weights == {"stable": 100.0, "candidate": 0.0}, live
    assert await store.active() == []


async def test_a_decision_whose_event_redis_refused_is_not_lost(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """An operator's routes change aborts the canary: its record was saved, then recording its
    event failed (Redis refused it), and the canary ended with no `aborted` event, none to
    come. Saved with its event in one step, neither lands, and the next look decides again."""
    routes, store = RouteStore(aredis, KEYS), CanaryStore(aredis, KEYS)
    await routes.seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    leader = _controller(aredis)
    await leader.look()  # the first step: 10 %
    live = (await routes.get_many([MODEL]))[MODEL]
    await routes.put(MODEL, Routes({"stable": 70.0, "candidate": 30.0}), "operator", live.version)
    async with _restricted(aredis, redis_url, KEYS.canary_events(MODEL)) as refused:
        with pytest.raises(NoPermissionError):
            await _controller(refused).look()

    await leader.look()

    ended = await store.get(MODEL)
    assert ended is not None and (ended.state, ended.weight) == ("aborted", 30.0), ended
    kinds = [event["type"] for event in await store.events(MODEL, 10)]
    assert kinds == ["step", "aborted"], kinds


async def test_a_step_of_batch_items_waits_for_its_p99_then_rolls_back(
    aredis: aioredis.Redis,
) -> None:
    """40 Batch API items and no online job: `min_requests` seen, its p99 never judged, and the
    step stepped on after its interval. It waits for as many online jobs, stepping on once
    they are healthy, and past `max_step_s` without them rolls back as inconclusive."""
    stats, store, routes = (
        VariantStats(aredis, KEYS),
        CanaryStore(aredis, KEYS),
        RouteStore(aredis, KEYS),
    )
    await routes.seed(MODEL, Routes({"stable": 50.0, "candidate": 50.0}))
    began = (bucket_of(time.time()) - 1) * BUCKET_S  # the samples below fall in its window
    at_50 = _canary(steps=[50.0, 100.0], interval_s=1.0, max_step_s=120.0, step=0, weight=50.0)
    assert await store.start(replace(at_50, step_started_at=began))
    bulk = [Sample(True, 1.0, 10.0, bulk=True)] * 40
    healthy = [Sample(True, 1.0, 10.0)] * 40
    await stats.record_samples({(MODEL, "stable"): healthy, (MODEL, "candidate"): bulk})
    leader = _controller(aredis)

    waiting = replace(at_50, step_started_at=began)  # within its max_step_s
    await leader.decide(waiting)
    assert (waiting.state, waiting.step, waiting.weight) == ("running", 0, 50.0), waiting

    overdue = replace(at_50, step_started_at=time.time() - 200)
    await leader.decide(overdue)
    assert (overdue.state, overdue.weight) == ("rolled_back", 0.0), overdue
    reason = (await store.events(MODEL, 1))[-1]["reason"]
    assert reason.startswith("online jobs in ") and "its p99 was never judged" in reason, reason

    await routes.put(MODEL, Routes({"stable": 50.0, "candidate": 50.0}), "test")  # as before
    await stats.record_samples({(MODEL, "candidate"): healthy})
    judged = replace(at_50, step_started_at=began)
    await leader.decide(judged)
    assert (judged.state, judged.step, judged.weight) == ("running", 1, 100.0), judged


async def test_a_decision_saved_twice_by_a_resend_logs_its_event_once(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client resends a script whose reply was lost (shared/redis_client.py): a save that
    now writes its event too must know its own rerun, or the event is logged twice."""
    store = CanaryStore(aredis, KEYS)
    await RouteStore(aredis, KEYS).seed(MODEL, Routes({"stable": 100.0, "candidate": 0.0}))
    assert await store.start(_canary())
    save = store._save  # the script as the client runs it when its first reply is lost

    async def resent(**kwargs: Any) -> Any:
        await save(**kwargs)  # the server ran it; its reply never came back
        return await save(**kwargs)

    monkeypatch.setattr(store, "_save", resent)
    await _controller(aredis, store).look()  # the first step: 10 %
    kinds = [event["type"] for event in await store.events(MODEL, 10)]
    assert kinds == ["step"], kinds
