"""A producer that answered a routes change serves it from then on (read your writes), on a real
Valkey: the change's own reload and the 100 ms poll used to run at once, and a poll that had
read the routes before the change landed wrote them back over the change's reload, so requests
after the 200 went by the old split until the next poll."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import redis.asyncio as aioredis

from producer_api.routes.live_routes import LiveRoutes
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes
from tests.conftest import REPO_ROOT

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
KEYS = Keys("traffic-refresh:")
REPOSITORY = ModelRepository.load(TRAFFIC)
OLD = Routes({"stable": 100.0, "candidate": 0.0})
NEW = Routes({"stable": 0.0, "candidate": 100.0})


class _SlowRead(RouteStore):
    """A store whose next read of the routes, once read, waits at `gate` (a slow round trip)."""

    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(client, KEYS)
        self.gate: asyncio.Event | None = None
        self.read = asyncio.Event()

    async def get_many(self, models: Iterable[str]) -> dict[str, Routes]:
        routes = await super().get_many(models)
        if (gate := self.gate) is not None:
            self.gate = None
            self.read.set()
            await gate.wait()
        return routes


async def test_a_poll_under_way_never_undoes_a_later_reload(aredis: aioredis.Redis) -> None:
    store = _SlowRead(aredis)
    await store.seed("ab", OLD)
    live = LiveRoutes(store, REPOSITORY)
    await live.refresh()
    await store.put("ab", Routes({"stable": 90.0, "candidate": 10.0}), "test")
    gate = asyncio.Event()
    store.gate = gate
    poll = asyncio.create_task(live.refresh())  # reads the 90/10 split, then waits
    await store.read.wait()
    await store.put("ab", NEW, "test")  # the PUT's own reload follows it
    reload = asyncio.create_task(live.refresh())
    await asyncio.sleep(0.05)  # the reload has had time to finish, were it not waiting
    gate.set()
    await asyncio.gather(poll, reload)
    served = live.of(REPOSITORY.models["ab"])
    assert served.weights == NEW.weights, served
