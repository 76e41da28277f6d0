"""A key holds at most CONVEYOR_MAX_STREAMS_PER_KEY job-event streams open: each polls Redis
about once a second while its job is queued, so a tenant opening streams without end starved
every other one. One more is refused before it opens; closing one makes room."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.api_keys import key_id_of
from shared.keys import Keys
from shared.settings import get_settings
from tests.conftest import issue_key, until, until_async

# No test serves minilm on the auth stack: its job stays queued, its streams open.
QUEUED = {"model": "minilm", "inputs": {"texts": ["held"]}}


async def _opened(api: httpx.AsyncClient, url: str, streams: AsyncExitStack) -> httpx.Response:
    """The response of one more stream, kept open (headers read, body not) until `streams`
    closes."""
    return await streams.enter_async_context(api.stream("GET", url))


@pytest.fixture
def key(auth_stack: Stack) -> str:
    """A fresh key: no other test's streams count toward its cap (issued outside the test's
    event loop, which `issue_key` cannot run in)."""
    return issue_key(auth_stack.redis_url, "streamer", "submit", "read")


async def test_a_key_opens_its_cap_of_event_streams_and_no_more(
    auth_stack: Stack, key: str
) -> None:
    cap = get_settings().max_streams_per_key
    limits = httpx.Limits(max_connections=None)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=auth_stack.base_url, headers=headers, timeout=30, limits=limits
    ) as api:
        submitted = await api.post("/v1/jobs", json=QUEUED)
        assert submitted.status_code == 202, submitted.text
        url = f"/v1/jobs/{submitted.json()['id']}/events"
        async with AsyncExitStack() as streams:
            opened = [await _opened(api, url, streams) for _ in range(cap)]
            assert [r.status_code for r in opened] == [200] * cap
            refused = await _opened(api, url, streams)
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            await refused.aread()
            assert refused.json()["error"]["type"] == "too_many_streams"

            await opened[0].aclose()  # the producer gives its place back as it ends

            async def reopened() -> bool:
                response = await _opened(api, url, streams)
                if response.status_code != 200:
                    await response.aclose()
                return response.status_code == 200

            assert await until_async(reopened, timeout=10)
    with redis.Redis.from_url(auth_stack.redis_url) as client:
        open_streams = Keys().open_streams(key_id_of(key))
        assert until(lambda: client.zcard(open_streams) == 0, timeout=10)
