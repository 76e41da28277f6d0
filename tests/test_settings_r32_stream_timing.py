"""How soon an open stream notices its key revoked (CONVEYOR_STREAM_RECHECK_S, 5 s by default:
job-event and OpenAI streams and the console's live feeds look again this often) and how long a
streamed OpenAI request waits for its job's first event before its headers are sent
(CONVEYOR_STREAM_FIRST_EVENT_S, 15 s by default, its keep-alive period too) are settings. Each
is taken by a producer built from them (in-process, on a real Valkey, no worker: the job stays
queued), and a value not positive or past a year is refused as the process starts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import DONE, ChatRenderer, OpenAIService
from shared.api_keys import KeySpec
from shared.keys import Keys
from shared.settings import MAX_TIMEOUT_S, Settings, bad_setting, settings_or_exit

LANE = Keys().queue("smollm2", "default")
DEFAULT_RECHECK_S = 5.0
DEFAULT_FIRST_EVENT_S = 15.0
SHORT_S = 0.2  # what the producers below are given


def test_the_defaults_are_the_constants_they_replace() -> None:
    settings = Settings()
    assert settings.stream_recheck_s == DEFAULT_RECHECK_S
    assert settings.stream_first_event_s == DEFAULT_FIRST_EVENT_S


@pytest.mark.parametrize(
    "name",
    [
        "CONVEYOR_STREAM_RECHECK_S",
        "CONVEYOR_STREAM_FIRST_EVENT_S",
        "CONVEYOR_STREAM_SHUTDOWN_GRACE_S",  # tests/test_settings_r33_stream_grace.py
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", str(MAX_TIMEOUT_S + 1), "nan"])
def test_out_of_bounds_values_are_refused_at_start(
    settings_env: Callable[..., None], name: str, value: str
) -> None:
    settings_env(**{name: value})
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = bad_setting(refused.value)
    assert f"{name}={value!r}" in line, line
    # what the producer's entry module ends with: one line naming the variable, no traceback
    with pytest.raises(SystemExit) as exited:
        settings_or_exit()
    assert str(exited.value) == f"Error: {line}"


def test_short_values_are_taken(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_STREAM_RECHECK_S="0.5", CONVEYOR_STREAM_FIRST_EVENT_S="1")
    assert (Settings().stream_recheck_s, Settings().stream_first_event_s) == (0.5, 1.0)


@asynccontextmanager
async def _producer(redis_url: str, aredis: aioredis.Redis, **settings: Any) -> AsyncIterator[Any]:
    """An in-process producer's app on real Valkey, started with `settings`; the smollm2 jobs a
    test enqueues (no worker serves them) are taken out of its lane on the way out."""
    app = create_app(Settings(redis_url=redis_url, instance_id="stream-timing", **settings))
    newest = await aredis.xrevrange(LANE, count=1)
    after = newest[0][0] if newest else b"0-0"
    async with app.router.lifespan_context(app):
        yield app
    if left := [entry_id for entry_id, _ in await aredis.xrange(LANE, min=b"(" + after)]:
        await aredis.xdel(LANE, *left)


def _chat() -> ChatCompletionRequest:
    message = ChatMessage(role="user", content="hi")
    return ChatCompletionRequest(model="smollm2", messages=[message], stream=True)


async def test_a_queued_jobs_stream_opens_after_the_configured_first_event_wait(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Given no wait of its own, a streamed request's opening waits the setting, not 15 s: it
    opens while its job is still queued, long before the default would have let it."""
    async with _producer(redis_url, aredis, auth="disabled", stream_first_event_s=SHORT_S) as app:
        service = OpenAIService(app.state.conveyor, ANONYMOUS)
        job_id = await service.submit(_chat())
        renderer = ChatRenderer(job_id, "smollm2")
        opening = asyncio.ensure_future(service.open_stream(job_id, renderer))
        # the default's wait is the alternative outcome: half of it is the hang guard
        await asyncio.wait({opening}, timeout=DEFAULT_FIRST_EVENT_S / 2)
        assert opening.done(), "the stream waited for its first event past the setting"
        status = await aredis.hget(Keys().job(job_id), "status")
        assert status == b"queued", status
        opened = opening.result()
        shutdown = anyio.Event()
        with anyio.fail_after(30):  # a hang guard only
            async for _ in service.stream(
                job_id, opened, ChatRenderer(job_id, "smollm2"), shutdown
            ):
                shutdown.set()  # closes the stream at its first chunk
        await service.cancel(job_id)


async def test_a_revoked_keys_stream_ends_at_the_configured_recheck(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A stream of a queued job (nothing to send) looks at its key every stream_recheck_s: its
    key revoked, it ends with an `unauthorized` error chunk and `[DONE]` well before the
    default 5 s look would have come, and its job is cancelled."""
    async with _producer(redis_url, aredis, auth="enabled", stream_recheck_s=SHORT_S) as app:
        state = app.state.conveyor
        spec = KeySpec(tenant="stream-timing", scopes=frozenset({"submit", "read"}))
        _, key = await state.api_keys.create(spec)
        service = OpenAIService(state, Principal.of(key, state.settings))
        job_id = await service.submit(_chat())
        renderer = ChatRenderer(job_id, "smollm2")
        opened = await service.open_stream(job_id, renderer, wait_s=0.05)  # queued: opens
        chunks: list[str] = []

        async def read() -> None:
            async for chunk in service.stream(job_id, opened, renderer, anyio.Event()):
                chunks.append(chunk)

        reading = asyncio.ensure_future(read())
        try:
            while not chunks:  # the role's opening chunk: the stream is under way
                await asyncio.sleep(0.01)
            assert await state.api_keys.revoke(key.key_id)
            # the default's look is the alternative outcome: most of it is the hang guard
            await asyncio.wait({reading}, timeout=DEFAULT_RECHECK_S * 0.8)
            assert reading.done(), "the revoked key's stream outlived the configured recheck"
        finally:
            reading.cancel()
        reading.result()
    assert chunks[-1] == DONE, chunks
    assert json.loads(chunks[-2])["error"]["type"] == "unauthorized", chunks
    assert len(chunks) == 3, chunks  # the role's opening chunk, no token
    status = await aredis.hget(Keys().job(job_id), "status")
    assert status == b"cancelled", status
