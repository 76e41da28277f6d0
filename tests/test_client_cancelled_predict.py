"""A predict its caller gives up on (a task cancelled, `asyncio.wait_for` timing out, Ctrl-C)
cancels its job on the real pipeline, found by the predict's Idempotency-Key: it ran on, using
a worker for nobody. A `wait` given up on leaves the job alone: `submit` + `wait` keeps it."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from typing import Any

import pytest

from conveyor.client import AsyncClient, Client, Job

pytestmark = pytest.mark.slow
PARKED = "canary"  # a variant no worker serves: its job waits in the queue for as long as asked


def _parked(client: Client, key: str, inputs: dict[str, Any]) -> Job:
    """The job that `key` made (a submit resent with it answers with that job)."""
    return client.submit("identity", inputs, idempotency_key=key, variant=PARKED)


def test_a_predict_cancelled_by_wait_for_cancels_its_job(
    base_url: str, identity_worker: int
) -> None:
    key, inputs = uuid.uuid4().hex, {"given_up": 1}

    async def give_up() -> None:
        async with AsyncClient(base_url) as client:
            predict = client.predict("identity", inputs, idempotency_key=key, variant=PARKED)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(predict, 1)

    asyncio.run(give_up())
    with Client(base_url) as client:
        assert _parked(client, key, inputs).status == "cancelled"


def test_a_predict_interrupted_by_ctrl_c_cancels_its_job(
    base_url: str, identity_worker: int
) -> None:
    key, inputs = uuid.uuid4().hex, {"interrupted": 1}
    ctrl_c = threading.Timer(1, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    with Client(base_url) as client:
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            client.predict("identity", inputs, idempotency_key=key, variant=PARKED)
        assert _parked(client, key, inputs).status == "cancelled"


def test_a_wait_given_up_on_leaves_its_job_running(base_url: str, identity_worker: int) -> None:
    async def give_up() -> None:
        async with AsyncClient(base_url) as client:
            job = await client.submit("identity", {"kept": 1}, variant=PARKED)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.wait(job.id), 1)
            assert (await client.get(job.id)).status == "queued"
            await client.cancel(job.id)  # this test's own clean-up

    asyncio.run(give_up())
