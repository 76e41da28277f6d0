"""A cancel of a job whose hash goes (its TTL ran out, Redis lost it) between the cancel's read
and its move is a 404, as a cancel of a job already gone is, not the 409 `already None` the
state machine's refusal of a job with no status read as. Writes are held back (CLIENT PAUSE
WRITE) so the cancel's reads pass and its TRANSITION waits while the hash expires."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async


async def test_a_cancel_whose_job_expires_before_its_move_is_404(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="cancel-gone")
    async with app_client(create_app(settings)) as client:
        submitted = await client.post("/v1/jobs", json={"model": "identity", "inputs": {"x": 1}})
        job_id = submitted.json()["id"]
        await aredis.pexpire(Keys().job(job_id), 1000)
        await aredis.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        try:
            cancel = asyncio.create_task(client.delete(f"/v1/jobs/{job_id}"))
            await until_async(lambda: _gone(aredis, job_id))
            assert not cancel.done()  # its reads found the job: it waits on its move
        finally:
            await aredis.execute_command("CLIENT", "UNPAUSE")
        answer = await cancel
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"] == {"type": "not_found", "message": f"job {job_id} not found"}


async def _gone(aredis: aioredis.Redis, job_id: str) -> bool:
    return await aredis.pttl(Keys().job(job_id)) == -2
