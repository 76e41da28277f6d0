"""Canary starts of round 24, on a real Valkey without a stack: a `min_requests` above the
latency samples a step's window can hold (SAMPLES_PER_BUCKET per 10 s bucket, WINDOW_SAMPLES
per window) is refused at the producer (422) and by the CLI (a usage error), since no step's p99
could ever be judged; and a start writes its `started` event in its own script, so a Redis error
after it no longer answers 500 for a canary running without one, and a start rerun (its reply
lost) still writes it once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import redis.asyncio as aioredis
from click.testing import CliRunner

from conveyor.cli import main
from producer_api.app import create_app
from shared.canary_store import Canary, CanaryStore
from shared.redis_client import connect
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import REPO_ROOT
from tests.reply_dropper import ReplyDropper
from tests.test_canary_r23_fixes import KEYS, MODEL, NOWHERE, _canary, _controller, _restricted

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url, auth="disabled", instance_id="canary-r24", model_repository=TRAFFIC
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_min_requests_no_step_window_can_hold_is_refused(
    producer: httpx.AsyncClient,
) -> None:
    """A 30 s step keeps at most 3 buckets of 5 000 samples: 15 001 online jobs could never be
    judged, and the canary was started only to roll back as never judged. 15 000 can be."""
    body: dict[str, Any] = {"variant": "candidate", "max_step_s": 30.0, "min_requests": 15_001}
    refused = await producer.post(f"/v1/models/{MODEL}/canary", json=body)
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith("min_requests: 15001 is more than the 15000 latency"), message
    assert (await producer.get(f"/v1/models/{MODEL}/canary")).json()["canary"] is None

    # the default max_step_s (5 intervals of 60 s) holds the window's 100 000 at most
    beyond = await producer.post(
        f"/v1/models/{MODEL}/canary", json={"variant": "candidate", "min_requests": 100_001}
    )
    assert beyond.status_code == 422, beyond.text
    assert "the 100000 latency samples" in beyond.json()["error"]["message"], beyond.text

    started = await producer.post(
        f"/v1/models/{MODEL}/canary", json=body | {"min_requests": 15_000}
    )
    assert started.status_code == 201, started.text


@pytest.mark.parametrize(
    ("options", "most"),
    [
        (["--max-step", "30s", "--min-requests", "15001"], 15_000),
        (["--interval", "10s", "--min-requests", "60001"], 60_000),  # the 120 s default
    ],
)
def test_min_requests_no_step_window_can_hold_is_a_usage_error(
    options: list[str], most: int
) -> None:
    """Held to the producer's rule before any call: with the producer down it read as an
    outage."""
    result = CliRunner().invoke(main, ["canary", "start", MODEL, "candidate", *options, *NOWHERE])

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--min-requests'" in result.output, result.output
    assert f"the {most} latency samples" in result.output, result.output


class _RecordRefusedAfterStart(CanaryStore):
    """A store whose START runs on an unrestricted client and every later call on `refused`,
    whose ACL lets it read the canary's record but not write it: Redis refuses what a start
    writes after its script."""

    def __init__(self, refused: aioredis.Redis, full: aioredis.Redis) -> None:
        super().__init__(refused, KEYS)
        self.full = CanaryStore(full, KEYS)

    async def start(self, canary: Canary, *event: dict[str, Any] | None) -> bool:
        return await self.full.start(canary, *event)


async def test_a_start_writes_its_started_event_in_its_own_script(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The `started` event was saved by a second call: Redis refusing it answered 500 while
    the canary ran with no `started` event."""
    async with _restricted(aredis, redis_url, KEYS.canary(MODEL)) as refused:
        store = _RecordRefusedAfterStart(refused, aredis)
        assert await _controller(refused, store).start(_canary()) is True

    store = CanaryStore(aredis, KEYS)
    running = await store.get(MODEL)
    assert running is not None and running.state == "running", running
    events = await store.events(MODEL)
    assert [(e["type"], e["state"], e["weight"]) for e in events] == [("started", "running", 0.0)]


async def test_a_start_rerun_after_its_reply_was_lost_writes_its_event_once(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The client resends a script whose reply was lost: the rerun is the start's own (its
    token), not a second start refused with 409, and its event is not written twice."""
    store = CanaryStore(aredis, KEYS)
    assert await store.start(replace(_canary(), model="aa"))  # its script loaded: no NOSCRIPT
    url = urlparse(redis_url)
    proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379)
    client = connect(await proxy.start(), cluster=False)  # the producer's: it resends the call
    try:
        assert await _controller(client).start(_canary()) is True
    finally:
        await client.aclose()
        await proxy.stop()
    assert proxy.dropped == 1 and b"NOSCRIPT" not in proxy.answer

    assert [event["type"] for event in await store.events(MODEL)] == ["started"]
    assert await _controller(aredis).start(_canary()) is False  # one runs already
