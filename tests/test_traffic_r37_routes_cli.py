"""`conveyor routes` against a real producer (served over HTTP from a thread of this process, on
the session's Valkey, no worker): `set --shadow V=R` keeps the shadows it does not name, as its
help and README say of everything not given (it dropped them, so retuning one shadow's rate
silently stopped the others); `show` says why the routes producers serve are not the stored
ones (the API's `adjusted`, which the CLI never printed)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.stack import free_port
from producer_api.app import create_app
from shared.keys import Keys
from shared.route_store import RouteStore
from shared.routing import Routes
from shared.settings import Settings
from tests.conftest import REPO_ROOT
from tests.local_http import served_app

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
KEYS = Keys("traffic-r37-cli:")


@pytest.fixture(scope="module")
def producer(redis_url: str) -> Iterator[str]:
    """A producer of the traffic fixtures' model `ab`, its own key prefix, auth off."""
    port = free_port()
    settings = Settings(
        redis_url=redis_url,
        model_repository=TRAFFIC,
        auth="disabled",
        key_prefix=KEYS.prefix,
        instance_id="traffic-r37-cli",
    )
    with served_app(create_app(settings), port) as url:
        yield url


def test_setting_one_shadows_rate_keeps_the_other_shadows(producer: str) -> None:
    routes = f"{producer}/v1/models/ab/routes"
    body = {"weights": {"stable": 100}, "shadows": {"mirror": 1.0, "flaky": 0.5}}
    assert httpx.put(routes, json=body).status_code == 200

    result = CliRunner().invoke(
        main, ["routes", "set", "ab", "--shadow", "mirror=0.25", "--url", producer]
    )

    assert result.exit_code == 0, result.output
    assert httpx.get(routes).json()["shadows"] == {"mirror": 0.25, "flaky": 0.5}
    assert "flaky                shadow, 50 % of online requests" in result.output


async def test_show_says_why_the_served_routes_are_not_the_stored_ones(
    producer: str, redis_url: str
) -> None:
    """Stored routes weighing a variant config.yaml no longer has (a redeploy removed it) are
    served as config.yaml's: the API's `adjusted` says so, and `routes show` printed the served
    split over a history ending in the stored one, with no word why."""
    async with aioredis.Redis.from_url(redis_url) as client:  # no flush: the producer's keys
        await RouteStore(client, KEYS).put("ab", Routes({"stable": 50.0, "removed": 50.0}), "x")

    result = CliRunner().invoke(main, ["routes", "show", "ab", "--url", producer])

    assert result.exit_code == 0, result.output
    assert "stable               100.00 %" in result.output, result.output
    assert (
        "warning: stored routes ignored, config.yaml's apply: model ab has no variant"
        " 'removed' (50 %)" in result.output
    ), result.output
