"""The route store on a real Valkey: a model may bear any name the repository allows, `version`
included, whose routes used to share their key with the global change counter (every routes
write then failed WRONGTYPE, for every model, and producers served config.yaml for good)."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.route_store import RouteStore
from shared.routing import Routes

KEYS = Keys("route-store:")


async def test_a_model_named_version_has_routes_like_any_other(aredis: aioredis.Redis) -> None:
    store = RouteStore(aredis, KEYS)
    assert await store.put("version", Routes({"a": 60.0, "b": 40.0}), "test") == 1
    assert await store.put("ab", Routes({"stable": 100.0}), "test") == 1
    assert await store.version() == 2
    live = await store.get_many(["version", "ab"])
    assert live["version"].weights == {"a": 60.0, "b": 40.0}
    assert (live["ab"].weights, live["ab"].version) == ({"stable": 100.0}, 1)
