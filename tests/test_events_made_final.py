"""A token follower of a job that ended without a final event of its own in its stream
(cancelled or expired while queued, dead-lettered mid-run), on a real Valkey. Its stream
waited one quiet `block_ms` before looking at the job, though the job had ended before the
stream opened; and the final it made from the job's hash had no id to resume after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from producer_api.token_hub import TokenFollower, TokenHub
from shared.codec import as_text, dumps
from shared.job_store import JobStore
from shared.keys import Keys, new_job_id
from shared.redis_client import RedisClient, connect
from shared.token_stream import TokenEvent, made_final_id

KEYS = Keys()
HOUR_MS = 3_600_000  # a follower's quiet wait: one the stream of an ended job must not sit out
ENDED_WITHIN_S = 30  # far below it: a follower still waiting fails, it does not hang the run


@pytest.fixture
async def parts(redis_url: str) -> AsyncIterator[tuple[RedisClient, TokenFollower]]:
    client = connect(redis_url, blocks_ms=0)
    hub = TokenHub(redis_url, client, KEYS, "made-final-test")
    try:
        yield client, TokenFollower(hub, JobStore(client, KEYS, 3600), KEYS, HOUR_MS)
    finally:
        await hub.stop()
        await client.aclose()


async def _follow(follower: TokenFollower, job_id: str) -> list[TokenEvent]:
    async def events() -> list[TokenEvent]:
        return [event async for event in follower.follow(job_id)]

    return await asyncio.wait_for(events(), ENDED_WITHIN_S)


async def test_a_job_cancelled_while_queued_ends_its_stream_at_once_with_an_id(
    parts: tuple[RedisClient, TokenFollower],
) -> None:
    client, follower = parts
    job_id = new_job_id("smollm2", "default")
    await client.hset(KEYS.job(job_id), mapping={"status": "cancelled", "model": "smollm2"})
    [final] = await _follow(follower, job_id)
    assert (final.kind, final.status, final.id) == ("final", "cancelled", "0-1")


async def test_a_dead_lettered_jobs_final_follows_its_streams_last_entry(
    parts: tuple[RedisClient, TokenFollower],
) -> None:
    client, follower = parts
    job_id = new_job_id("smollm2", "default")
    token = TokenEvent("token", "cut short ", 2)
    last = as_text(await client.xadd(KEYS.tokens(job_id), token.encode()))
    error = dumps({"type": "DeadLettered", "message": "delivered 3 times"}).decode()
    await client.hset(KEYS.job(job_id), mapping={"status": "failed", "error": error})
    *tokens, final = await _follow(follower, job_id)
    assert [t.id for t in tokens] == [last]
    assert (final.status, final.id) == ("failed", made_final_id(last))
    ms, seq = last.split("-")
    assert final.id == f"{ms}-{int(seq) + 1}"
