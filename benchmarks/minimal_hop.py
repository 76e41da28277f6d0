"""The floor under part A: the least a Python service of Conveyor's shape does per request, on
the same parts (uvicorn, redis-py with hiredis, Valkey). Its endpoint appends the job to a
stream and awaits the reply on pub/sub; its worker blocks on the stream (XREADGROUP), publishes
each job's inputs back and acknowledges them. No validation beyond the body's shape, no job
record to poll, no admission, retries or recovery: what Conveyor charges per job above this
hop is what those cost. `python -m benchmarks.minimal_hop` runs the worker."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import orjson
import redis.asyncio as aioredis
import uvloop
from fastapi import FastAPI, Request
from fastapi.responses import ORJSONResponse
from pydantic import BaseModel
from redis.exceptions import ResponseError

from benchmarks.pipeline_stack import BIN, database_url, spawn, spawn_api, wait_until_answers
from conveyor.stack import Stack, free_port
from shared.heap_tuning import settle_heap
from shared.redis_client import push_as_received
from shared.settings import Settings

# A database of its own, beside Conveyor's and the Celery baseline's.
REDIS_URL = os.environ.get("MINIMAL_HOP_REDIS_URL", "redis://127.0.0.1:6379/2")
STREAM, GROUP = "minimal-hop", "workers"
PATH = "/hop/predict"


class Replies:
    """The API's one subscription: each reply resolves the request waiting for its job id."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.channel = f"minimal-hop:reply:{os.getpid()}"
        self.pubsub = client.pubsub(
            ignore_subscribe_messages=True, push_handler_func=push_as_received
        )
        self.waiting: dict[str, asyncio.Future[Any]] = {}

    async def listen(self) -> None:
        async for message in self.pubsub.listen():
            reply = orjson.loads(message["data"])
            future = self.waiting.pop(reply["id"], None)
            if future is not None and not future.done():
                future.set_result(reply["outputs"])


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # redis-py's plain pool, the cheapest, with room for a connection per request in flight
    client = aioredis.Redis.from_url(REDIS_URL, max_connections=1024)
    replies = Replies(client)
    await replies.pubsub.subscribe(replies.channel)
    listener = asyncio.create_task(replies.listen())
    app.state.client, app.state.replies = client, replies
    settle_heap(Settings())  # the collector tuned as Conveyor's producer tunes its own
    yield
    listener.cancel()
    await replies.pubsub.aclose()
    await client.aclose()


app = FastAPI(title="minimal hop", lifespan=lifespan)


class PredictBody(BaseModel):
    inputs: dict[str, Any]


@app.post(PATH)
async def hop_predict(body: PredictBody, request: Request) -> ORJSONResponse:
    replies: Replies = request.app.state.replies
    job_id = uuid.uuid4().hex
    reply = asyncio.get_running_loop().create_future()
    replies.waiting[job_id] = reply
    try:
        entry = {"id": job_id, "reply": replies.channel, "inputs": orjson.dumps(body.inputs)}
        await request.app.state.client.xadd(STREAM, entry)
        return ORJSONResponse({"outputs": await asyncio.wait_for(reply, 30)})
    finally:
        replies.waiting.pop(job_id, None)


async def serve() -> None:
    """The worker: a micro-batch per read, its replies, XACK and XDEL in one round trip."""
    client = aioredis.Redis.from_url(REDIS_URL)
    with suppress(ResponseError):  # the group exists already
        await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    settle_heap(Settings())
    while True:
        batches: Any = await client.xreadgroup(GROUP, "worker", {STREAM: ">"}, 64, 1000)
        for _, entries in batches or []:
            await _answer(client, entries)


async def _answer(client: aioredis.Redis, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
    ids = [entry_id for entry_id, _ in entries]
    async with client.pipeline(transaction=False) as pipe:
        for _, fields in entries:
            reply = b'{"id":"%s","outputs":%s}' % (fields[b"id"], fields[b"inputs"])
            pipe.publish(fields[b"reply"], reply)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        await pipe.execute()


def start_minimal_hop(stack: Stack, payload: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """Start the hop's API (the same uvicorn command line as the producer's) and its worker
    against the stack's Valkey; returns the endpoint's URL and the two pids."""
    port = free_port()
    env = {"MINIMAL_HOP_REDIS_URL": database_url(stack, 2)}
    api = spawn_api(stack, "minimal-hop-api", "benchmarks.minimal_hop:app", port, env)
    worker = spawn(stack, "minimal-hop-worker", [str(BIN / "python"), "-m", __name__], env)
    url = f"http://127.0.0.1:{port}{PATH}"
    wait_until_answers(url, payload)
    return url, {"hop api": api, "hop worker": worker}


if __name__ == "__main__":
    uvloop.run(serve())
