"""A producer built from the Settings it is given (create_app(settings), as tests and embedders
make one) against an environment saying otherwise: its clients took the cluster flag from
CONVEYOR_REDIS_CLUSTER, not from those Settings, so a producer told it runs on one server came
up as a cluster client (and failed at start on a server with cluster mode off), and its token
hub's blocking reader likewise. The Settings given decide, for every client the producer makes."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.auth.principal import ANONYMOUS
from producer_api.events.api_router import server_sent
from producer_api.events.serving import EventsService
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.settings import Settings
from shared.token_stream import TokenEvent
from tests.app_client import app_client
from workers.partition.token_writer import TokenAppend, TokenWriter


async def test_the_settings_given_say_whether_redis_is_a_cluster(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    settings = Settings(
        redis_url=redis_url, redis_cluster=False, auth="disabled", instance_id="cluster-flag"
    )
    app = create_app(settings)
    async with app_client(app) as client:
        body = {"model": "smollm2", "inputs": {"prompt": "hi"}, "parameters": {"max_tokens": 4}}
        submitted = await client.post("/v1/jobs", json=body)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        await aredis.hset(Keys().job(job_id), "status", JobStatus.RUNNING.value)
        opened = await EventsService(app.state.conveyor, ANONYMOUS).open(job_id, None)
        assert opened is not None
        events = server_sent(opened, anyio.Event())
        writer = TokenWriter(aredis, Keys(), 60)
        token = TokenEvent("token", text="Hel", tokens=1)
        await writer.write([TokenAppend(job_id, "run-a", 1, [token], expire=True)], [])
        with anyio.fail_after(5):  # a live token: the hub's blocking reader brought it
            assert '"Hel"' in (await anext(events)).data
        await events.aclose()
