"""A producer whose routes polls failed while Redis restarted without its data re-reads the
routes once it reaches Redis again, on a real Valkey: it compared the global change counter
alone, and a counter that other producers' seeding and changes brought back to the number it
last applied read as "nothing changed", so it served the lost routes until the next change."""

from __future__ import annotations

import socket

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api.routes.live_routes import LiveRoutes
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from tests.conftest import REPO_ROOT

KEYS = Keys("traffic-edges-restart:")
REPOSITORY = ModelRepository.load(REPO_ROOT / "tests" / "fixtures" / "traffic_repository")
CONFIG = Routes({"stable": 100.0, "candidate": 0.0})


def _closed_port() -> int:
    """A local port nothing listens on: a Redis that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_poll_after_an_outage_rereads_routes_a_restart_lost(
    aredis: aioredis.Redis,
) -> None:
    store = RouteStore(aredis, KEYS)
    live = LiveRoutes(store, REPOSITORY)
    await live.refresh()  # seeds config.yaml's split: counter 1
    await store.put("ab", Routes({"stable": 90.0, "candidate": 10.0}), "test")  # counter 2
    await live.refresh()
    down = aioredis.Redis(port=_closed_port(), retry=Retry(NoBackoff(), 0))
    live.store = RouteStore(down, KEYS)
    with pytest.raises(RedisConnectionError):
        await live.refresh()  # Redis is restarting
    await down.aclose()
    await aredis.delete(*await aredis.keys(f"{KEYS.prefix}*"))  # ...and comes back empty
    await store.seed("ab", CONFIG)  # another producer seeds it: counter 1
    await store.put("ab", Routes({"stable": 20.0, "candidate": 80.0}), "test")  # counter 2
    live.store = store
    await live.refresh()
    assert live.of(REPOSITORY.models["ab"]).weights == {"stable": 20.0, "candidate": 80.0}
