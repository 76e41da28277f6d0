"""Scripts rerun after their reply was lost, on a real Valkey. The client resends a command
through a dropped connection (shared/redis_client.py), so a script the server ran is run again
with the same arguments, and the rerun must answer as the first run did: a canary's start
answered 409 "has a canary running already" for its own start (no `started` event), a routes
write with `expected_version` 409 "changed meanwhile" for its own change (one without logged the
change twice), and a batch's last look told nobody to finalize for STALE_MS (its webhook and
output files a minute late)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from shared.batch_api_store import BatchApiStore, BatchStatus
from shared.canary_store import Canary, CanaryStore
from shared.job_store import now_ms
from shared.keys import Keys, new_job_id
from shared.model_repository import ModelRepository
from shared.route_store import RouteStore, VersionConflict
from shared.routing import Routes
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher

KEYS = Keys("resend:")
MODEL = "ab"
TTL_S = 600

Script = Callable[..., Awaitable[Any]]


def resent(script: Script) -> Script:
    """The script as the client runs it when the first reply is lost: twice, the same call."""

    async def twice(**kwargs: Any) -> Any:
        await script(**kwargs)  # the server ran it; its reply never came back
        return await script(**kwargs)

    return twice


def _canary() -> Canary:
    return Canary(
        model=MODEL,
        variant="candidate",
        baseline="stable",
        steps=[10.0, 100.0],
        interval_s=60.0,
        max_error_rate=0.05,
        max_p99_ms=1_000.0,
        min_requests=10,
        by="key:k1 (default)",
    )


async def test_a_canary_start_rerun_is_still_its_own_start(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CanaryStore(aredis, KEYS)
    controller = CanaryController(
        store,
        RouteStore(aredis, KEYS),
        VariantStats(aredis, KEYS),
        ModelRepository({}),
        WebhookDispatcher("redis://unused"),  # the canary has no webhook: never sent
    )
    canary = _canary()
    monkeypatch.setattr(store, "_start", resent(store._start))
    assert await controller.start(canary) is True
    assert [event["type"] for event in await store.events(MODEL)] == ["started"]
    assert await store.active() == [MODEL]
    monkeypatch.undo()
    # another start, even of the same document (same millisecond, same caller), is refused
    assert await controller.start(replace(canary)) is False


@pytest.mark.parametrize("expected", [None, 1], ids=["any-version", "expected-version"])
async def test_a_routes_write_rerun_is_its_own_change_logged_once(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch, expected: int | None
) -> None:
    store = RouteStore(aredis, KEYS)
    await store.seed(MODEL, Routes({"stable": 100.0}))
    monkeypatch.setattr(store, "_put", resent(store._put))
    assert await store.put(MODEL, Routes({"stable": 50.0, "candidate": 50.0}), "op", expected) == 2
    assert [change.version for change in await store.history(MODEL)] == [1, 2]
    assert await store.version() == 2
    monkeypatch.undo()
    with pytest.raises(VersionConflict):  # a later writer that read version 1 still loses
        await store.put(MODEL, Routes({"stable": 100.0}), "op", 1)


async def test_a_batch_advance_rerun_still_finalizes(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BatchApiStore(aredis, KEYS, TTL_S)
    batch_id = "batch_resend"
    open_list = KEYS.batch_open(batch_id, "identity", "default")
    ids = [new_job_id("identity", "default") for _ in range(3)]
    for job_id in ids:
        await aredis.hset(KEYS.job(job_id), "status", "succeeded")
    await store.create(batch_id, {"tenant": "default", "total": len(ids)}, TTL_S)
    await store.add_items(batch_id, [(job_id, open_list) for job_id in ids], [], TTL_S)
    await store.start(batch_id, [open_list], len(ids), {"invalid": 0}, now_ms() + TTL_S * 1000)

    monkeypatch.setattr(store, "_advance", resent(store._advance))
    look = await store.refresh(batch_id, window=0)
    assert look is not None and look.finalize, look
    assert look.fields["status"] == BatchStatus.FINALIZING
    assert look.counts["succeeded"] == len(ids) and look.fields["open"] == "0"
    monkeypatch.undo()
    other = await store.refresh(batch_id, window=0)  # another producer's look: not its turn
    assert other is not None and not other.finalize and other.counts["succeeded"] == len(ids)
