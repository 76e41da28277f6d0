"""How long a stopping producer (SIGTERM) lets its open streams say goodbye before cutting them,
and after how long its waiting requests (long-polls, submit-and-wait, whole OpenAI answers)
answer with what they have, is a setting (CONVEYOR_STREAM_SHUTDOWN_GRACE_S, 3 s by default,
once the module constant GRACE_S). A producer built with a short one (in-process, on a real
Valkey, no worker: the job stays queued) ends its waits that soon (a value not positive or
past a year is refused as the process starts: tests/test_settings_r32_stream_timing.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sse_starlette.sse import AppStatus

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

NAME = "CONVEYOR_STREAM_SHUTDOWN_GRACE_S"
DEFAULT_GRACE_S = 3.0
SHORT_S = 0.2  # what the producer below is given
KEYS = Keys("stream-grace:")
QUEUED = {"model": "identity", "inputs": {"x": 1}}  # no worker here: it stays queued
LONG_POLL_S = 60  # the wait the request asks for: far past either grace


def test_the_default_is_the_constant_it_replaces() -> None:
    assert Settings().stream_shutdown_grace_s == DEFAULT_GRACE_S


def test_a_short_value_is_taken(settings_env: Callable[..., None]) -> None:
    settings_env(**{NAME: "0.5"})
    assert Settings().stream_shutdown_grace_s == 0.5


async def test_a_stopping_producer_answers_a_long_poll_after_the_configured_grace(
    redis_url: str,
) -> None:
    """Asked to stop, the producer answers a long-poll of a queued job with the job as it
    stands once the setting's grace is over: long before its 60 s wait, and before the
    default grace would have let it."""
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        auth="disabled",
        instance_id="stream-grace",
        stream_shutdown_grace_s=SHORT_S,
    )
    app = create_app(settings)
    async with app_client(app) as client:
        accepted = await client.post("/v1/jobs", json=QUEUED)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        url = f"/v1/jobs/{job_id}"
        polling = asyncio.ensure_future(client.get(url, params={"wait": LONG_POLL_S}))
        AppStatus.should_exit = True  # what uvicorn's SIGTERM handler sets (sse-starlette)
        try:
            # the default's grace is the alternative outcome: most of it is the hang guard
            await asyncio.wait({polling}, timeout=DEFAULT_GRACE_S * 0.8)
            assert polling.done(), "the long-poll outlived the configured grace"
        finally:
            AppStatus.should_exit = False
            polling.cancel()
        polled = polling.result()
        assert app.state.conveyor.draining.asked()
        # the stop left the job queued (cancelled here, not left for the next run's producer)
        assert (await client.delete(url)).status_code == 200
    assert polled.status_code == 200, polled.text
    assert polled.json()["status"] == "queued", polled.text
