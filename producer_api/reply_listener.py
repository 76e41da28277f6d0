"""One pub/sub subscription per producer wakes every waiter (long-poll, submit-and-wait) when
a worker publishes terminal jobs (one message per micro-batch, an array of the job views this
producer waits for): no polling, and one connection however many requests wait."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api.redis_outage import RedisOutage
from producer_api.task_cancel import cancel_and_wait
from shared.codec import loads

log = logging.getLogger(__name__)


class ReplyListener:
    def __init__(self, client: aioredis.Redis, channel: str) -> None:
        self.channel = channel
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._waiters: dict[str, set[asyncio.Future[dict[str, Any]]]] = defaultdict(set)
        self._channels = {channel}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._pubsub.subscribe(self.channel)
        self._task = asyncio.create_task(self._listen(), name="reply-listener")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self._pubsub.aclose()

    async def follow(self, channel: str) -> None:
        """Also hear another producer's replies (a job submitted through another replica)."""
        if channel and channel not in self._channels:
            self._channels.add(channel)
            await self._pubsub.subscribe(channel)

    def register(self, job_id: str) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[job_id].add(future)
        return future

    def unregister(self, job_id: str, future: asyncio.Future[dict[str, Any]]) -> None:
        waiters = self._waiters.get(job_id)
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[job_id]

    async def _listen(self) -> None:
        outage = RedisOutage("reply listener")
        while True:
            try:
                if outage.failures:
                    await self._pubsub.connect()  # reconnects, then resubscribes every channel
                    outage.recovered()
                async for message in self._pubsub.listen():
                    if message["type"] == "message":
                        self._deliver_all(loads(message["data"]))
            except RedisConnectionError as exc:
                await asyncio.sleep(outage.failed(exc))

    def _deliver_all(self, message: list[dict[str, Any]] | dict[str, Any]) -> None:
        """A worker publishes one array per micro-batch (every job of it this producer waits
        for); a cancel or a dead letter publishes one view alone."""
        for view in message if isinstance(message, list) else [message]:
            self._deliver(view)

    def _deliver(self, view: dict[str, Any]) -> None:
        for future in self._waiters.pop(view.get("id", ""), ()):
            if not future.done():
                future.set_result(view)
