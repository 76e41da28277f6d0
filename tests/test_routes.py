"""Live routes: weighted rendezvous splits hold their proportions and move only the minimum share
of keys when a weight changes; a change made through one producer is applied by another without
a restart (the delay is measured and printed); bad routes get a clear 4xx and leave the live
ones as they were; every change is versioned and logged; shadow copies run on the bulk lane and
never reach the client."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from producer_api.routes.live_routes import POLL_S, LiveRoutes
from shared.codec import loads
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes, choose_variant, seed_routes
from shared.settings import Settings
from tests.conftest import REPO_ROOT, issue_key, running_stack, until
from tests.console_login import console_login

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
AB = ModelRepository.load(TRAFFIC).models["ab"]
KEYS = Keys()
HTTP = httpx.Client(timeout=30)  # one pool: a client per call would pay for TLS setup each time


@pytest.fixture(scope="module", autouse=True)
def _close_http() -> Iterator[None]:
    yield
    HTTP.close()


def test_seed_routes_normalise_config_weights_to_percent() -> None:
    routes = seed_routes(AB)
    assert routes.weights == {"stable": 100.0, "candidate": 0.0, "flaky": 0.0}
    assert routes.shadows == {"mirror": 1.0}
    assert routes.sticky_by == "routing_key"


def test_split_holds_its_proportions_over_10k_keys() -> None:
    routes = Routes({"stable": 70.0, "candidate": 20.0, "flaky": 10.0})
    counts = Counter(choose_variant(AB, None, f"user-{i}", routes) for i in range(10_000))
    for variant, weight in routes.weights.items():
        assert counts[variant] / 10_000 == pytest.approx(weight / 100, abs=0.015), counts
    unsticky = Counter(choose_variant(AB, None, None, routes) for _ in range(10_000))
    assert unsticky["stable"] / 10_000 == pytest.approx(0.7, abs=0.02), unsticky


KEYS_MOVED = 100_000


def _moved(before: Routes, after: Routes) -> Counter[tuple[str, str]]:
    """How many of KEYS_MOVED users each change of routes moves, by (old, new) variant."""
    return Counter(
        (old, new)
        for key in (f"user-{i}" for i in range(KEYS_MOVED))
        if (old := choose_variant(AB, None, key, before))
        != (new := choose_variant(AB, None, key, after))
    )


def test_raising_a_weight_moves_only_its_share_and_only_to_it() -> None:
    before = Routes({"candidate": 10.0, "stable": 45.0, "flaky": 45.0})
    after = before.with_share("candidate", 20.0, {})
    assert after.weights == {"stable": 40.0, "flaky": 40.0, "candidate": 20.0}
    moved = _moved(before, after)
    assert moved.total() / KEYS_MOVED == pytest.approx(0.10, abs=0.01), moved
    assert {new for _, new in moved} == {"candidate"}, moved


def test_a_step_carries_no_negative_zero_on() -> None:
    """Another variant's -0.0 was scaled to -0.0 by a canary step, and stored and shown so."""
    routes = Routes({"stable": 100.0, "flaky": -0.0}).with_share("candidate", 10.0, {})
    assert [math.copysign(1, w) for w in routes.weights.values()] == [1, 1, 1], routes


def test_a_change_of_the_others_ratios_moves_more_than_the_minimum() -> None:
    """README said any weight change moved only the minimum share: it does when the others keep
    their ratios (above); 70/20/10 to 50/40/10 moves keys off `flaky`, whose 10 % stayed."""
    before = Routes({"stable": 70.0, "candidate": 20.0, "flaky": 10.0})
    after = Routes({"stable": 50.0, "candidate": 40.0, "flaky": 10.0})
    moved = _moved(before, after)
    assert moved.total() / KEYS_MOVED == pytest.approx(0.216, abs=0.001), moved
    assert moved[("flaky", "candidate")] > 0, moved


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--shadow", "mirror=0.5", "--no-shadows"], "not both"),  # the shadow was dropped
        ([], "nothing to set"),  # a new version that changed nothing
    ],
)
def test_cli_set_refuses_options_that_contradict_or_say_nothing(
    args: list[str], problem: str
) -> None:
    nowhere = ["--url", f"http://127.0.0.1:{free_port()}"]  # refused before any call
    result = CliRunner().invoke(main, ["routes", "set", "ab", *args, *nowhere])
    assert result.exit_code == 2 and problem in result.output, result.output


@pytest.fixture
def quiet() -> Iterator[None]:
    """No INFO lines: 10k "job accepted" lines would only slow the test down."""
    logging.disable(logging.INFO)
    yield
    logging.disable(logging.NOTSET)


async def test_live_split_holds_over_10k_submissions(
    redis_url: str, aredis: aioredis.Redis, quiet: None
) -> None:
    """10 000 submits through the producer (in-process, on a real Redis, no worker): the
    variants each accepted job was routed to keep the live weights within 1.5 points."""
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="split"
    )
    app = create_app(settings)
    weights = {"stable": 70, "candidate": 20, "flaky": 10}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            put = await client.put("/v1/models/ab/routes", json={"weights": weights, "shadows": {}})
            assert put.status_code == 200, put.text

            async def submit(i: int) -> str:
                body = {"model": "ab", "inputs": {}, "routing_key": f"user-{i}"}
                response = await client.post("/v1/jobs", json=body)
                assert response.status_code == 202, response.text
                variant: str = response.json()["variant"]
                return variant

            variants: Counter[str] = Counter()
            for start in range(0, 10_000, 100):
                variants.update(await asyncio.gather(*(submit(start + i) for i in range(100))))
    assert sum(variants.values()) == 10_000
    for variant, weight in weights.items():
        assert variants[variant] / 10_000 == pytest.approx(weight / 100, abs=0.015), variants
    queued = {v: await aredis.xlen(KEYS.queue("ab", v)) for v in weights}
    assert queued == {v: variants[v] for v in weights}  # each job sits in its variant's stream


async def test_stored_routes_that_no_longer_fit_the_model_are_ignored(
    aredis: aioredis.Redis,
) -> None:
    store = RouteStore(aredis, KEYS)
    repository = ModelRepository.load(TRAFFIC)
    live = LiveRoutes(store, repository)
    await live.refresh()  # seeds config.yaml's routes
    await live.refresh()
    assert live.of(AB).version == 1 and live.of(AB).weights == seed_routes(AB).weights
    await store.put("ab", Routes({"stable": 50.0, "removed": 50.0}), "test")
    await live.refresh()
    assert live.of(AB).weights == seed_routes(AB).weights  # config.yaml's, not the stale ones
    await store.put("ab", Routes({"stable": 50.0, "candidate": 50.0}), "test")
    await live.refresh()
    assert live.of(AB).weights == {"stable": 50.0, "candidate": 50.0}


async def test_a_removed_variant_without_weight_is_dropped_not_the_whole_routes(
    aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Removing a 0-weight variant from config.yaml sent every producer back to config.yaml's
    split (100 % stable after a canary had moved everything to candidate); it is dropped now,
    and only weight on a removed variant still gives way to config.yaml's routes."""
    store = RouteStore(aredis, KEYS)
    live = LiveRoutes(store, ModelRepository.load(TRAFFIC))
    await live.refresh()  # seeds config.yaml's routes
    await store.put("ab", Routes({"stable": 0.0, "candidate": 100.0, "removed": 0.0}), "test")
    await live.refresh()
    assert live.of(AB).weights == {"stable": 0.0, "candidate": 100.0}
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == [
        "live routes of ab (version 2): dropped 'removed': no weight and no longer in config.yaml"
    ]
    await store.put("ab", Routes({"stable": 100.0}, {"mirror": 0.5, "gone": 1.0}), "test")
    await live.refresh()
    assert (live.of(AB).weights, live.of(AB).shadows) == ({"stable": 100.0}, {"mirror": 0.5})
    await store.put("ab", Routes({"candidate": 90.0, "removed": 10.0}), "test")
    await live.refresh()
    assert live.of(AB).weights == seed_routes(AB).weights


async def test_shown_routes_are_the_ones_producers_serve(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The routes API showed the stored split while producers served another one; it shows
    the served one now, and says why it differs from the stored one."""
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="shown"
    )
    app = create_app(settings)
    store = RouteStore(aredis, KEYS)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            served = await client.put("/v1/models/ab/routes", json={"weights": {"stable": 100}})
            assert served.json()["adjusted"] is None, served.text
            await store.put("ab", Routes({"candidate": 100.0, "removed": 0.0}), "test")
            dropped = (await client.get("/v1/models/ab/routes")).json()
            assert dropped["weights"] == {"candidate": 100.0}
            assert "removed" in dropped["adjusted"]
            await store.put("ab", Routes({"candidate": 50.0, "removed": 50.0}), "test")
            ignored = (await client.get("/v1/models/ab/routes")).json()
            assert ignored["weights"] == seed_routes(AB).weights
            assert ignored["version"] == dropped["version"] + 1
            assert "config.yaml" in ignored["adjusted"] and "'removed'" in ignored["adjusted"]


async def test_a_negative_zero_weight_is_stored_served_and_gauged_as_0(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """`-0.0 < 0` is False: a PUT giving a variant -0.0 passed the check and was stored, shown
    and gauged as -0 (`-0 %` on the console, `-0.00 %` in `conveyor routes`)."""
    settings = Settings(
        redis_url=redis_url, model_repository=TRAFFIC, auth="disabled", instance_id="zero"
    )
    app = create_app(settings)
    body = {"weights": {"stable": 100.0, "candidate": -0.0}, "shadows": {"mirror": -0.0}}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            put = await client.put("/v1/models/ab/routes", json=body)
            assert put.status_code == 200, put.text
            shown = (await client.get("/v1/models/ab/routes")).json()
            scrape = (await client.get("/metrics")).text
    stored = loads(await aredis.hget(KEYS.routes("ab"), "doc"))
    for served in (put.json(), shown, stored):
        shares = [*served["weights"].values(), *served["shadows"].values()]
        assert [math.copysign(1, share) for share in shares] == [1, 1, 1], served
    assert 'conveyor_route_weight{model="ab",variant="candidate"} 0.0' in scrape


# --- the real pipeline: two producers, one worker serving every variant of `ab` ---


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("routes-stack")
    with running_stack(
        folder, CONVEYOR_MODEL_REPOSITORY=str(TRAFFIC), PYTHONPATH=str(REPO_ROOT)
    ) as stack:
        stack.start_worker("ab", name="ab-worker")
        yield stack


@pytest.fixture(scope="module")
def urls(traffic: Stack) -> list[str]:
    """Two producer replicas on the same Redis."""
    return [traffic.base_url, traffic.start_producer(free_port(), name="producer-b")]


@pytest.fixture(scope="module")
def admin(traffic: Stack) -> dict[str, str]:
    return {"X-API-Key": issue_key(traffic.redis_url, "ops", "admin")}


@pytest.fixture(scope="module")
def client_key(traffic: Stack) -> dict[str, str]:
    """Hundreds of submits a second: the tests count variants, not rate limits."""
    limits = {"rate_per_s": 10_000.0, "burst": 10_000}
    return {"X-API-Key": issue_key(traffic.redis_url, "acme", "submit", "read", **limits)}


def _put(url: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    return HTTP.put(f"{url}/v1/models/ab/routes", json=body, headers=headers)


def _routes(url: str, headers: dict[str, str]) -> dict[str, Any]:
    response = HTTP.get(f"{url}/v1/models/ab/routes", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _submit(url: str, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = HTTP.post(f"{url}/v1/jobs", json={"model": "ab", **body}, headers=headers)
    assert response.status_code in (200, 202), response.text
    job: dict[str, Any] = response.json()
    return job


def test_a_change_reaches_the_other_producer_without_a_restart(
    urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    first, second = urls
    assert _put(first, admin, weights={"stable": 100}).status_code == 200
    until(lambda: _submit(second, client_key, inputs={})["variant"] == "stable")
    changed = _put(first, admin, weights={"stable": 0, "candidate": 100})
    assert changed.status_code == 200, changed.text
    applied_at = time.monotonic()

    def routed_to_candidate() -> float | None:
        if _submit(second, client_key, inputs={})["variant"] == "candidate":
            return time.monotonic() - applied_at
        return None

    # a measurement, not a bound (a stalled machine is no failure): printed with the poll it
    # comes from, and eventually applied without a restart
    delay = until(routed_to_candidate)
    print(f"the second producer applied the change after {delay:.3f}s (it polls every {POLL_S}s)")
    until(lambda: _routes(second, admin)["warnings"] == [])  # ab-worker serves every variant
    scrape = HTTP.get(f"{second}/metrics").text
    assert 'conveyor_route_weight{model="ab",variant="candidate"} 100.0' in scrape
    # routes that no longer name candidate: its gauge said 100 for as long as the process lived
    assert _put(first, admin, weights={"stable": 100}).status_code == 200
    gone = 'conveyor_route_weight{model="ab",variant="candidate"} 0.0'
    until(lambda: gone in HTTP.get(f"{second}/metrics").text)


def test_live_split_and_stickiness_through_both_producers(
    traffic: Stack, urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    _put(urls[0], admin, weights={"stable": 75, "candidate": 25})
    _until_applied(traffic, urls)
    variants: Counter[str] = Counter()
    for i in range(300):
        key = f"user-{i}"
        picks = {_submit(url, client_key, inputs={}, routing_key=key)["variant"] for url in urls}
        assert len(picks) == 1, f"{key} was split across variants {picks}"
        variants[picks.pop()] += 1
    assert variants["candidate"] / 300 == pytest.approx(0.25, abs=0.075), variants
    assert variants["stable"] + variants["candidate"] == 300


def test_sticky_by_tenant_keeps_the_tenant_on_one_variant(
    traffic: Stack, urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    split = _put(urls[0], admin, weights={"stable": 50, "candidate": 50}, sticky_by="tenant")
    assert split.status_code == 200, split.text
    _until_applied(traffic, urls)
    picks = {
        _submit(url, client_key, inputs={}, routing_key=f"user-{i}")["variant"]
        for i in range(40)
        for url in urls
    }
    assert len(picks) == 1, f"one tenant's requests went to {picks}"
    _put(urls[0], admin, weights={"stable": 100}, sticky_by="routing_key")


def _until_applied(traffic: Stack, urls: list[str]) -> None:
    """Wait until every producer applies the latest routes (its `conveyor_routes_version`)."""
    client = redis.Redis.from_url(traffic.redis_url)
    latest = int(client.get(KEYS.routes_version) or 0)
    client.close()
    pattern = re.compile(r"^conveyor_routes_version (\S+)$", re.MULTILINE)

    def applied(url: str) -> bool:
        match = pattern.search(HTTP.get(f"{url}/metrics").text)
        return match is not None and float(match[1]) >= latest

    until(lambda: all(applied(url) for url in urls))


def test_bad_routes_get_a_clear_4xx_and_change_nothing(
    traffic: Stack, urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    url = urls[0]
    before = _routes(url, admin)
    cases: list[tuple[dict[str, str], dict[str, Any], int, str]] = [
        (admin, {"weights": {"stable": 50, "nope": 50}}, 422, 'no variant "nope"'),
        (admin, {"weights": {"stable": 50, "candidate": 40}}, 422, "sum to 100"),
        (admin, {"weights": {"stable": 0, "candidate": 0}}, 422, "sum to 100, not 0"),
        (admin, {"weights": {"stable": 110, "candidate": -10}}, 422, "not negative"),
        (admin, {"weights": {"stable": 100}, "shadows": {"mirror": -0.5}}, 422, "[0, 1]"),
        (
            admin,
            {"weights": {"stable": 90, "candidate": 10}, "shadows": {"candidate": 1}},
            422,
            "both",
        ),
        (admin, {"weights": {"stable": 90, "mirror": 10}}, 422, "never live traffic"),
        (admin, {"weights": {"stable": 100}, "sticky_by": "ip"}, 422, "sticky_by"),
        (admin, {"weights": {"stable": 100}, "expected_version": -1}, 422, "expected_version"),
        (admin, {"weights": {"stable": "Infinity"}}, 422, "stable: Input should be a valid number"),
        (client_key, {"weights": {"stable": 100}}, 403, "admin"),
        ({}, {"weights": {"stable": 100}}, 401, "API key"),
    ]
    for headers, body, status, words in cases:
        response = _put(url, headers, **body)
        assert response.status_code == status, (body, response.text)
        assert words in response.json()["error"]["message"], response.text
    stale = _put(url, admin, weights={"stable": 100}, expected_version=before["version"] - 1)
    assert stale.status_code == 409, stale.text
    assert HTTP.get(f"{url}/v1/models/nope/routes", headers=admin).status_code == 404
    assert _routes(url, admin) == before


def test_every_change_is_versioned_and_logged(urls: list[str], admin: dict[str, str]) -> None:
    url = urls[0]
    start = _routes(url, admin)
    # A PUT replaces the routes whole: it carries the shadows on to keep them.
    weights = {"stable": 60, "candidate": 40}
    _put(url, admin, weights=weights, shadows=start["shadows"], sticky_by="tenant")
    after = _put(url, admin, weights={"stable": 100}).json()
    assert after["version"] == start["version"] + 2
    last_two = after["history"][-2:]
    assert [c["version"] for c in last_two] == [start["version"] + 1, start["version"] + 2]
    assert last_two[0]["old"]["weights"] == start["weights"]
    assert last_two[0]["new"] == {
        "weights": {"stable": 60.0, "candidate": 40.0},
        "shadows": start["shadows"],
        "sticky_by": "tenant",
    }
    assert last_two[1]["old"] == last_two[0]["new"]
    assert all(c["by"].startswith("key:") and "(ops)" in c["by"] for c in last_two)
    assert all(abs(c["at"] - time.time()) < 60 for c in last_two)


def test_cli_sets_and_shows_routes(traffic: Stack, urls: list[str], admin: dict[str, str]) -> None:
    env = {"CONVEYOR_URL": urls[1], "CONVEYOR_API_KEY": admin["X-API-Key"]}
    runner = CliRunner()
    result = runner.invoke(
        main, ["routes", "set", "ab", "--weight", "stable=90", "--weight", "candidate=10"], env=env
    )
    assert result.exit_code == 0, result.output
    assert "candidate" in result.output and "10.00 %" in result.output
    assert _routes(urls[0], admin)["weights"] == {"stable": 90.0, "candidate": 10.0}
    refused = runner.invoke(main, ["routes", "set", "ab", "--weight", "stable=50"], env=env)
    assert refused.exit_code != 0 and "422 invalid_routes" in refused.output
    shown = runner.invoke(main, ["routes", "show", "ab"], env=env)
    assert shown.exit_code == 0 and "sticky by routing_key" in shown.output


def test_cli_weighting_a_shadow_keeps_the_other_shadows(
    traffic: Stack, urls: list[str], admin: dict[str, str]
) -> None:
    """A variant given traffic stops shadowing, the other shadows kept: weighting a shadow was a
    422 ("cannot both serve and shadow") short of --no-shadows, which dropped them all. A small
    rate shows as itself (`0%` was printed for 0.4 %)."""
    env = {"CONVEYOR_URL": urls[1], "CONVEYOR_API_KEY": admin["X-API-Key"]}
    shadows = {"candidate": 0.004, "mirror": 0.5}
    assert _put(urls[0], admin, weights={"stable": 100}, shadows=shadows).status_code == 200
    shown = CliRunner().invoke(main, ["routes", "show", "ab"], env=env)
    assert "candidate            shadow, 0.4 % of online requests" in shown.output, shown.output
    weighted = ["routes", "set", "ab", "--weight", "stable=50", "--weight", "candidate=50"]
    result = CliRunner().invoke(main, weighted, env=env)
    assert result.exit_code == 0, result.output
    routes = _routes(urls[0], admin)
    assert (routes["weights"], routes["shadows"]) == (
        {"stable": 50.0, "candidate": 50.0},
        {"mirror": 0.5},
    )


def test_cli_resets_routes_to_config_yaml_on_every_producer(
    traffic: Stack, urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    """There was no way back to the deployed config.yaml's routes but retyping them."""
    env = {"CONVEYOR_URL": urls[1], "CONVEYOR_API_KEY": admin["X-API-Key"]}
    moved = _put(urls[0], admin, weights={"stable": 0, "candidate": 100}, shadows={})
    assert moved.status_code == 200, moved.text
    version = moved.json()["version"]
    runner = CliRunner()
    stale = ["routes", "reset", "ab", "--expected-version", str(version - 1)]
    refused = runner.invoke(main, stale, env=env)
    assert refused.exit_code != 0 and "409 conflict" in refused.output, refused.output
    result = runner.invoke(main, ["routes", "reset", "ab"], env=env)
    assert result.exit_code == 0, result.output
    assert f"version {version + 1}" in result.output and "(ops)" in result.output
    seeded = seed_routes(AB)
    shown = _routes(urls[0], admin)
    assert (shown["weights"], shown["shadows"]) == (seeded.weights, seeded.shadows)
    _until_applied(traffic, urls)
    assert {_submit(url, client_key, inputs={})["variant"] for url in urls} == {"stable"}


def _predict(url: str, headers: dict[str, str], inputs: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "ab", "inputs": inputs, "routing_key": "u1"}
    response = HTTP.post(f"{url}/v1/jobs?wait=10", json=body, headers=headers)
    assert response.status_code == 200, response.text
    job: dict[str, Any] = response.json()
    return job


def _comparable(job: dict[str, Any]) -> dict[str, Any]:
    """What the client gets, less what differs between any two jobs: the id, the timings, and
    how many other jobs shared its micro-batch."""
    return {k: v for k, v in job.items() if k not in ("id", "timings", "batch_size")}


def test_shadow_copies_run_on_the_bulk_lane_and_never_reach_the_client(
    traffic: Stack, urls: list[str], admin: dict[str, str], client_key: dict[str, str]
) -> None:
    url = urls[0]  # a PUT applies at once on the producer that took it
    inputs = {"text": f"shadowed {uuid.uuid4().hex}"}
    client = redis.Redis.from_url(traffic.redis_url)
    online, bulk = KEYS.queue("ab", "mirror"), KEYS.bulk_queue("ab", "mirror")
    _put(url, admin, weights={"stable": 100}, shadows={})
    plain = _predict(url, client_key, inputs)
    bulk_before = _entries_added(client, bulk)
    _put(url, admin, weights={"stable": 100}, shadows={"mirror": 1.0})
    done = _predict(url, client_key, inputs)
    assert _comparable(done) == _comparable(plain)
    assert set(done) == set(plain) and set(done["timings"]) == set(plain["timings"])

    result = until(lambda: client.hgetall(KEYS.shadow_result(done["id"])), timeout=15)
    shadow_id = result[b"shadow_id"].decode()
    assert result[b"agree"] == b"1" and result[b"shadow_variant"] == b"mirror"
    assert _entries_added(client, bulk) == bulk_before + 1
    assert _entries_added(client, online) == 0, "a shadow copy went to the online lane"
    shadow = client.hgetall(KEYS.job(shadow_id))
    assert shadow[b"variant"] == b"mirror" and shadow[b"status"] == b"succeeded"
    assert shadow[b"shadow_of"] == done["id"].encode()
    assert shadow[b"tenant"] == b"~shadow"  # no key's tenant: not billed to or readable by one
    for headers in (client_key, admin):
        hidden = HTTP.get(f"{url}/v1/jobs/{shadow_id}", headers=headers)
        assert hidden.status_code == 404, hidden.text
    with httpx.Client(base_url=url) as console:
        assert console_login(console, admin["X-API-Key"]).status_code == 303
        board = console.get("/console/routes").text
    compared = re.search(
        r"mirror: 100% of online requests\s*<br><small>(\d+) pairs · (\S+)% agree", board
    )
    assert compared is not None, board
    assert int(compared[1]) >= 1 and compared[2] == "100", compared[0]
    _put(url, admin, weights={"stable": 100}, shadows={})


def _entries_added(client: redis.Redis, stream: str) -> int:
    return int(client.xinfo_stream(stream)["entries-added"])
