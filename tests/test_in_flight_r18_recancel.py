"""A submit whose client left while its in-flight slot was being taken gives the slot back: the
disconnect watch's cancel, raised once the flush that carried the admit had answered (a slow
Redis: replies lagged by a real TCP relay), landed before the clean-up that gives the slot back
was entered, and the key's slot stayed taken with no job behind it until pruned at the cap."""

from __future__ import annotations

from functools import partial
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from producer_api import client_disconnect
from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_long_poll_r13_disconnect import QUEUED, WAIT, Leaving
from tests.test_submit_cleanup_r17_recancel import LAG_S, _Lagging, _ready, relay

__all__ = ["relay"]

KEYS = Keys("in-flight-r18-gone:")


class _Authorized(Leaving):
    """A leaving client's request that carries an API key."""

    key: bytes = b""

    def scope(self) -> dict[str, Any]:
        scope = super().scope()
        bearer = (b"authorization", b"Bearer " + self.key)
        return {**scope, "headers": [*scope["headers"], bearer]}


async def test_a_submit_cut_short_while_taking_its_slot_gives_it_back(
    relay: tuple[_Lagging, str], aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lagging, url = relay
    monkeypatch.setattr(client_disconnect, "WATCH_AFTER_S", 0.05)  # within the admit's reply
    spec = KeySpec("acme", frozenset({"submit", "read"}), max_in_flight=2)
    key, record = await ApiKeyStore(aredis, KEYS).create(spec)
    app = create_app(Settings(redis_url=url, key_prefix=KEYS.prefix, auth="enabled"))
    async with app_client(app) as client:
        await until_async(partial(_ready, client), timeout=5, every=0.01)
        # a job first, unlagged: its scripts loaded, so the lagged admit runs at its first try
        kept = await client.post(
            "/v1/jobs", json=QUEUED, headers={"Authorization": f"Bearer {key}"}
        )
        assert kept.status_code == 202, kept.text
        left = _Authorized("POST", f"/v1/jobs?wait={WAIT}", orjson.dumps(QUEUED))
        left.key = key.encode()
        left.gone.set()  # the client is gone by the time the watch listens
        lagging.lag = LAG_S
        try:
            await app(left.scope(), left.receive, left.send)
        finally:
            lagging.lag = 0.0
    assert left.status() == 499
    slots = await aredis.zrange(KEYS.in_flight(record.key_id), 0, -1)
    assert [slot.decode() for slot in slots] == [kept.json()["id"]]  # the left one given back
