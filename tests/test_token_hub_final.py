"""A token stream's `final` against its job's hash, on a real Valkey. A worker appends a job's
final event before FINISH writes its result; one that died in between (kill -9, Redis dropped)
left the hash `running`, another worker reran the job after the visibility timeout (`restart`,
its text, its own final, then FINISH), and every reader stopped at the dead run's final: live
followers and new readers alike (SSE, OpenAI) answered with a result that is not the stored
one. A follower ends only at the stream's last word, as the job's hash confirms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from producer_api.token_hub import TokenFollower, TokenHub
from shared.codec import as_text, dumps
from shared.job_store import JobStore
from shared.keys import Keys, new_job_id
from shared.redis_client import RedisClient, connect
from shared.token_stream import TokenEvent
from tests.conftest import until_async

KEYS = Keys()
BLOCK_MS = 100  # a quiet follower's look at the job: several while the hash stays `running`
DEAD_RUN = (TokenEvent("token", "dead run's answer", 4), TokenEvent("final", status="succeeded"))
RERUN = (
    TokenEvent("restart"),
    TokenEvent("token", "rerun's answer", 3),
    TokenEvent("final", status="succeeded", finish_reason="stop"),
)


@dataclass
class Job:
    """One generate job's hash and token stream, and a follower of that stream."""

    client: RedisClient
    follower: TokenFollower
    job_id: str

    async def append(self, *events: TokenEvent) -> list[str]:
        return [as_text(await self.client.xadd(self.stream, e.encode())) for e in events]

    async def mark(self, status: str, **fields: str) -> None:
        await self.client.hset(KEYS.job(self.job_id), mapping={"status": status, **fields})

    @property
    def stream(self) -> str:
        return KEYS.tokens(self.job_id)

    async def follow(self, after: str = "0-0") -> list[TokenEvent]:
        return [event async for event in self.follower.follow(self.job_id, after)]


@pytest.fixture
async def job(redis_url: str) -> AsyncIterator[Job]:
    client = connect(redis_url, blocks_ms=0)
    hub = TokenHub(redis_url, client, KEYS, "final-test")
    follower = TokenFollower(hub, JobStore(client, KEYS, 3600), KEYS, BLOCK_MS)
    job = Job(client, follower, new_job_id("smollm2", "default"))
    await job.mark("running", model="smollm2", variant="default")
    try:
        yield job
    finally:
        await hub.stop()
        await client.aclose()


def answer(events: list[TokenEvent]) -> tuple[str, TokenEvent]:
    """The text and final a reader ends with (a restart drops the text so far, as the OpenAI
    and console readers do); exactly one final, the last event."""
    assert [e.final for e in events].count(True) == 1 and events[-1].final, events
    text = ""
    for event in events:
        text = "" if event.kind == "restart" else text + event.text
    return text, events[-1]


@pytest.mark.parametrize("resume", [False, True], ids=["from-start", "resume-before-final"])
async def test_a_final_that_a_rerun_follows_does_not_end_the_stream(job: Job, resume: bool) -> None:
    first, _ = await job.append(*DEAD_RUN)
    await job.append(*RERUN)
    await job.mark("succeeded")
    text, final = answer(await job.follow(first if resume else "0-0"))
    assert (text, final.finish_reason) == ("rerun's answer", "stop")


async def test_a_final_the_hash_does_not_confirm_waits_for_the_rerun(job: Job) -> None:
    events: list[TokenEvent] = []

    async def follow() -> None:
        async for event in job.follower.follow(job.job_id):
            events.append(event)

    async def read_the_dead_run() -> bool:
        return following.done() or any(e.kind == "token" for e in events)

    await job.append(*DEAD_RUN)
    following = asyncio.create_task(follow())
    await until_async(read_the_dead_run, 10, 0.01)
    await asyncio.sleep(4 * BLOCK_MS / 1000)  # looks at the hash: still `running`
    assert not following.done(), events
    await job.append(*RERUN)
    await job.mark("succeeded")
    await asyncio.wait_for(following, 10)
    text, final = answer(events)
    assert (text, final.finish_reason) == ("rerun's answer", "stop")


async def test_a_held_final_yields_to_the_jobs_end_without_a_rerun(job: Job) -> None:
    """The job ends another way before any rerun writes (dead-lettered here; cancelled or
    expired alike): the follower ends with the hash's result, not the dead run's."""
    await job.append(*DEAD_RUN)
    following = asyncio.create_task(job.follow())
    await asyncio.sleep(4 * BLOCK_MS / 1000)
    error = {"type": "DeadLettered", "message": "delivered 3 times"}
    await job.mark("failed", error=dumps(error).decode())
    _, final = answer(await asyncio.wait_for(following, 10))
    assert (final.status, final.error) == ("failed", error)
