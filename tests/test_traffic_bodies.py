"""What the admin API takes and shows for live traffic, through an in-process producer on a real
Valkey: a number given as `true` or a string is refused, not read as one (a weight of `true`
was 1 %, a canary's `max_error_rate: true` one no error rate could roll back), and a canary
shows its own decisions, not the last canary's under its `started`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from producer_api.app import create_app
from shared.settings import Settings
from tests.conftest import REPO_ROOT

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
ROUTES = "/v1/models/ab/routes"
CANARY = "/v1/models/ab/canary"


@pytest.fixture
async def api(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A producer of its own keys, so no other test's producer drives its canaries."""
    settings = Settings(
        redis_url=redis_url,
        model_repository=TRAFFIC,
        auth="disabled",
        instance_id="traffic-bodies",
        key_prefix="traffic-bodies:",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client
            await client.delete(CANARY)  # none left running: 409 when none is


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weights": {"stable": True, "candidate": 99}}, "weights.stable"),
        ({"weights": {"stable": "50", "candidate": 50}}, "weights.stable"),
        ({"weights": {"stable": 100}, "shadows": {"mirror": True}}, "shadows.mirror"),
        ({"weights": {"stable": 100}, "expected_version": True}, "expected_version"),
    ],
)
async def test_routes_refuse_a_number_that_is_not_one(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    before = (await api.get(ROUTES)).json()
    response = await api.put(ROUTES, json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["error"]["message"], response.text
    assert (await api.get(ROUTES)).json() == before


@pytest.mark.parametrize(
    "bound",
    [
        {"max_error_rate": True},
        {"min_requests": True},
        {"interval_s": "60"},
        {"steps": [True, 100]},
        {"max_p99_ms": "500"},
    ],
)
async def test_a_canary_refuses_a_bound_that_is_not_a_number(
    api: httpx.AsyncClient, bound: dict[str, Any]
) -> None:
    response = await api.post(CANARY, json={"variant": "candidate", **bound})
    assert response.status_code == 422, response.text
    assert next(iter(bound)) in response.json()["error"]["message"], response.text
    assert (await api.get(CANARY)).json()["canary"] is None


async def test_a_canary_shows_its_own_decisions_not_the_last_ones(
    api: httpx.AsyncClient,
) -> None:
    first = await api.post(CANARY, json={"variant": "candidate"})
    assert first.status_code == 201, first.text
    assert (await api.delete(CANARY)).status_code == 200
    second = await api.post(CANARY, json={"variant": "flaky"})
    assert second.status_code == 201, second.text
    for view in (second.json(), (await api.get(CANARY)).json()):
        assert view["canary"]["variant"] == "flaky"
        decisions = [(e["variant"], e["type"]) for e in view["events"]]
        assert decisions[0] == ("flaky", "started"), decisions
        assert {variant for variant, _ in decisions} == {"flaky"}, decisions
