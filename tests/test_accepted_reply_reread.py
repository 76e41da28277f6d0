"""A predict's job that ended with a reply lacking `attempts` (cancelled while queued; a dead
letter's reply has none either) reads the job's hash again for them. Redis failing that read
was a 503 to retry, for a job already accepted and ended: the client's retry of a predict
(no idempotency key) ran a second job. The producer runs in-process on a real Valkey; its job
store's client is pointed at a closed port once the job is enqueued, so only the re-read
fails."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis

from conveyor.stack import free_port
from producer_api.app import create_app
from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect
from shared.settings import Settings


async def _enqueued(client: aioredis.Redis, queue: str) -> str:
    """The id of the first job on `queue`, once there is one."""
    for _ in range(500):
        if entries := await client.xrange(queue, count=1):
            return entries[0][1][b"id"].decode()
        await asyncio.sleep(0.02)
    raise AssertionError(f"no job reached {queue}")


async def test_a_cancelled_predict_answers_409_when_its_hash_cannot_be_read_again(
    redis_url: str, aredis: aioredis.Redis, capfd: pytest.CaptureFixture[str]
) -> None:
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="reread"))
    closed = connect(f"redis://127.0.0.1:{free_port()}", blocks_ms=0, timeout_s=1)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            predict = asyncio.create_task(
                client.post("/v1/models/identity/predict", json={"inputs": {"x": 1}}, timeout=60)
            )
            job_id = await _enqueued(aredis, Keys().queue("identity", "default"))
            app.state.conveyor.job_store.redis = closed  # the re-read finds Redis gone
            await JobStore(aredis, Keys(), 60).transition(job_id, JobStatus.CANCELLED)
            response = await asyncio.wait_for(predict, 60)
    await closed.aclose()
    assert response.status_code == 409, response.text
    assert response.json()["error"]["message"].startswith(f"job {job_id} cancelled")
    # the producer's own (JSON) log handler, which the app's lifespan installs, says why
    assert f"job {job_id} accepted, but its state could not be read" in capfd.readouterr().err
