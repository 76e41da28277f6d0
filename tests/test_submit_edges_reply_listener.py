"""A reply channel message that holds no ended job's view is dropped alone. One that was not
JSON, or no list of objects with a text `id`, raised out of the reply listener's task, which
ended: every waiter of the producer (long-polls, `?wait`, `/predict`) sat out its whole wait
from then on, until the producer restarted. One with no terminal `status` woke its job's
waiters early, with the job not ended. The producer runs in-process on a real Valkey with no
worker; the bad message and a well-formed reply are published while a long-poll waits."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.codec import dumps
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

# Long enough that a poll not woken by the reply answers the job as the hash has it (`queued`).
WAIT_S = 3
BAD = [
    b"not json",
    b"[1]",
    b'{"id": ["not", "text"]}',
    b'{"id": "JOB", "status": ["running"]}',
    b'{"id": "JOB", "status": "running", "attempts": 1}',
]


@pytest.mark.parametrize("bad", BAD)
async def test_a_bad_reply_message_leaves_the_right_reply_heard(
    redis_url: str, aredis: aioredis.Redis, bad: bytes
) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="bad-reply")
    async with app_client(create_app(settings)) as client:
        submitted = await client.post("/v1/jobs", json={"model": "identity", "inputs": {"x": 1}})
        job_id = submitted.json()["id"]
        channel = await aredis.hget(Keys().job(job_id), "reply")
        poll = asyncio.create_task(client.get(f"/v1/jobs/{job_id}", params={"wait": WAIT_S}))
        # a view only a reply carries (the hash says `queued`): what the poll answers if woken
        reply = dumps({"id": job_id, "status": "succeeded", "attempts": 1, "outputs": {"x": 2}})
        while not poll.done():
            await aredis.execute_command("SPUBLISH", channel, bad.replace(b"JOB", job_id.encode()))
            await aredis.execute_command("SPUBLISH", channel, reply)
            await asyncio.sleep(0.05)
        answer = await poll
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert (seen["status"], seen.get("outputs")) == ("succeeded", {"x": 2}), seen
