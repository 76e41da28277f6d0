"""A key holds at most CONVEYOR_MAX_STREAMS_PER_KEY job-event streams open: each polls Redis
about once a second while its job is queued, so a tenant opening streams without end starved
every other one. One more is refused before it opens; closing one makes room. A key's own
`max_streams` (`conveyor keys create --max-streams`) overrides the setting for that key alone."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.api_keys import ApiKey, key_id_of
from shared.keys import Keys
from shared.settings import Settings, get_settings
from tests.conftest import issue_key, until, until_async

# No test serves minilm on the auth stack: its job stays queued, its streams open.
QUEUED = {"model": "minilm", "inputs": {"texts": ["held"]}}
CONVEYOR = str(Path(sys.executable).parent / "conveyor")
# The auth stack's CONVEYOR_STREAM_RECHECK_S (its default): a stream renews its place this often.
RECHECK_S = Settings.model_fields["stream_recheck_s"].default


async def _opened(api: httpx.AsyncClient, url: str, streams: AsyncExitStack) -> httpx.Response:
    """The response of one more stream, kept open (headers read, body not) until `streams`
    closes."""
    return await streams.enter_async_context(api.stream("GET", url))


@pytest.fixture
def key(auth_stack: Stack) -> str:
    """A fresh key: no other test's streams count toward its cap (issued outside the test's
    event loop, which `issue_key` cannot run in)."""
    return issue_key(auth_stack.redis_url, "streamer", "submit", "read")


@pytest.fixture
def capped_key(auth_stack: Stack) -> str:
    """A fresh key of the same tenant whose own cap is one stream."""
    return issue_key(auth_stack.redis_url, "streamer", "submit", "read", max_streams=1)


async def _streams_opened(base_url: str, key: str, count: int) -> list[int]:
    """The statuses of `count` streams one key opens at once on a queued job of its own."""
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as api:
        submitted = await api.post("/v1/jobs", json=QUEUED)
        assert submitted.status_code == 202, submitted.text
        url = f"/v1/jobs/{submitted.json()['id']}/events"
        async with AsyncExitStack() as streams:
            opened = [await _opened(api, url, streams) for _ in range(count)]
            if (last := opened[-1]).status_code == 429:  # a stream's own body never ends
                await last.aread()
                assert last.json()["error"]["type"] == "too_many_streams"
            return [r.status_code for r in opened]


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


async def test_a_keys_own_max_streams_caps_that_key_alone(
    auth_stack: Stack, key: str, capped_key: str
) -> None:
    assert await _streams_opened(auth_stack.base_url, capped_key, 2) == [200, 429]
    assert await _streams_opened(auth_stack.base_url, key, 2) == [200, 200]


def test_keys_create_stores_and_lists_max_streams(auth_stack: Stack) -> None:
    env = {**os.environ, "CONVEYOR_REDIS_URL": auth_stack.redis_url}

    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        command = [CONVEYOR, "keys", *args]
        return subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=60, check=False
        )

    made = keys("create", "--tenant", "streamer", "--max-streams", "3", "--json")
    assert made.returncode == 0, made.stderr
    key_id = json.loads(made.stdout)["key_id"]
    with redis.Redis.from_url(auth_stack.redis_url) as client:
        stored = ApiKey.from_fields(client.hgetall(Keys().api_key(key_id)))
    assert stored.spec.max_streams == 3
    listed = [json.loads(line) for line in keys("list", "--json").stdout.splitlines()]
    assert {k["key_id"]: k["max_streams"] for k in listed}[key_id] == 3
    refused = keys("create", "--tenant", "streamer", "--max-streams", "0")
    assert refused.returncode == 2 and "max streams 0 must be at least 1" in refused.stderr


async def _sse(response: httpx.Response) -> list[tuple[str, str]]:
    """The (event, data) pairs of an SSE body, read to its end."""
    events: list[tuple[str, str]] = []
    name = ""
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            events.append((name, line.removeprefix("data:").strip()))
    return events


async def test_a_stream_that_lost_its_place_ends_with_too_many_streams(
    auth_stack: Stack, capped_key: str
) -> None:
    """A stream renews its place only while it is read: one whose client stopped reading let it
    lapse, another stream of the key took it, and once read again the first streamed on beside
    it, two on a cap of one (its renewal's refusal was ignored). It ends at its next renewal
    now, with the error a stream refused at open gets. Its place is taken here by hand."""
    headers = {"authorization": f"Bearer {capped_key}"}
    open_streams = Keys().open_streams(key_id_of(capped_key))
    async with httpx.AsyncClient(base_url=auth_stack.base_url, headers=headers, timeout=30) as api:
        submitted = await api.post("/v1/jobs", json=QUEUED)
        assert submitted.status_code == 202, submitted.text
        async with api.stream("GET", f"/v1/jobs/{submitted.json()['id']}/events") as stream:
            assert stream.status_code == 200
            with redis.Redis.from_url(auth_stack.redis_url) as client:
                [place] = client.zrange(open_streams, 0, -1)
                seconds, micros = client.time()
                client.zrem(open_streams, place)
                client.zadd(open_streams, {"another": seconds * 1000 + micros // 1000})
            async with asyncio.timeout(RECHECK_S + 5):  # its next renewal, and some
                events = await _sse(stream)
    name, data = events[-1]
    assert name == "error" and json.loads(data)["type"] == "too_many_streams", events
