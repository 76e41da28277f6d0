"""A streamed OpenAI request waits for its job's first event before it answers
(CONVEYOR_STREAM_FIRST_EVENT_S); its key is looked at every CONVEYOR_STREAM_RECHECK_S meanwhile,
as an open stream's is. Revoked while the job is still queued (no worker serves its model), the
request is answered at the next look with the 401 a revoked key gets, in OpenAI's shape and
before any byte of a stream, and its job is cancelled: it no longer waits out the whole
first-event wait, its job queued for nobody. Real processes: a producer, keys on, on its own
Valkey."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import anyio
import httpx
import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack
from producer_api.auth.principal import Principal
from producer_api.live_feed import stop_reading
from producer_api.openai.serving import ChatRenderer, OpenAIService
from shared.api_keys import KeySpec
from shared.codec import RequestEntry
from shared.keys import Keys
from tests.conftest import issue_key, running_stack, until
from tests.test_settings_r32_stream_timing import _chat, _producer
from tests.test_stream_shutdown import PACED, PROMPT, _headers, _revoke

pytestmark = pytest.mark.slow
RECHECK_S = 0.5
# Far past the hang guard below: a request answered within the guard did not wait it out.
FIRST_EVENT_S = 600.0
HANG_GUARD_S = 60.0
LANE = Keys().queue("paced", "default")


@pytest.fixture(scope="module")
def workerless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Keys on and the `paced` model, which no worker serves: its jobs stay queued."""
    with running_stack(
        tmp_path_factory.mktemp("workerless"),
        CONVEYOR_AUTH="enabled",
        CONVEYOR_MODEL_REPOSITORY=PACED,
        CONVEYOR_STREAM_RECHECK_S=str(RECHECK_S),
        CONVEYOR_STREAM_FIRST_EVENT_S=str(FIRST_EVENT_S),
    ) as stack:
        yield stack


class StreamedChat(threading.Thread):
    """One streamed chat request, read to its end; `response` once it answered."""

    def __init__(self, base_url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{base_url}/v1/chat/completions"
        self.headers = _headers(key)
        self.response: httpx.Response | None = None

    def run(self) -> None:
        message = {"role": "user", "content": PROMPT}
        body = {"model": "paced", "messages": [message], "stream": True, "max_tokens": 5}
        with httpx.Client(timeout=FIRST_EVENT_S + 60) as client:
            self.response = client.post(self.url, json=body, headers=self.headers)


def _queued_job(store: redis.Redis) -> str:
    """The id of the one job in the model's lane ("" while there is none yet)."""
    entries = store.xrange(LANE)
    return RequestEntry.decode(entries[0][1]).job_id if len(entries) == 1 else ""


def test_a_key_revoked_while_its_stream_waits_for_a_queued_job_is_answered_401(
    workerless: Stack,
) -> None:
    """Before, it was answered only once the wait ran out (a stream opened, then cut at its
    next look), its job queued for nobody all along."""
    key = issue_key(workerless.redis_url, "queued-revoked", "submit", "read")
    request = StreamedChat(workerless.base_url, key)
    store = redis.Redis.from_url(workerless.redis_url)
    try:
        request.start()
        job_id = until(lambda: _queued_job(store))
        # the request waits for the job's first event, which no worker will send
        assert request.is_alive() and request.response is None
        assert store.hget(Keys().job(job_id), "status") == b"queued"
        asyncio.run(_revoke(workerless.redis_url, key))
        request.join(HANG_GUARD_S)
        assert not request.is_alive(), "the request waited on for its job's first event"
        status = store.hget(Keys().job(job_id), "status")
    finally:
        store.close()
    response = request.response
    assert response is not None
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("unauthorized", "invalid_api_key"), error
    assert job_id in error["message"], error
    assert status == b"cancelled", status


async def test_a_good_keys_stream_opens_after_its_looks_while_its_job_waits(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Looked at many times while its job stays queued, a good key's request is not cut: its
    stream opens once the first-event wait passes, its job still queued."""
    settings = {"auth": "enabled", "stream_recheck_s": 0.02, "stream_first_event_s": 0.5}
    async with _producer(redis_url, aredis, **settings) as app:
        state = app.state.conveyor
        spec = KeySpec(tenant="queued-kept", scopes=frozenset({"submit", "read"}))
        _, key = await state.api_keys.create(spec)
        service = OpenAIService(state, Principal.of(key, state.settings))
        job_id = await service.submit(_chat())
        with anyio.fail_after(HANG_GUARD_S):  # a hang guard only
            opened = await service.open_stream(job_id, ChatRenderer(job_id, "smollm2"))
        await stop_reading(opened.events, opened.first)
        status = await aredis.hget(Keys().job(job_id), "status")
        await service.cancel(job_id)
    assert status == b"queued", status
