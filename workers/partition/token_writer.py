"""Appends one loop tick's token events, for every running job at once, in ONE pipelined round
trip, and reads those jobs' statuses back in the same trip: a job cancelled through the API is
seen (and aborted) after the next engine step without any extra Redis call."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.keys import Keys
from shared.token_stream import TokenEvent


class TokenWriter:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    async def write(
        self,
        events: Sequence[tuple[str, TokenEvent]],
        expire: Collection[str],
        watch: Sequence[str],
    ) -> dict[str, str | None]:
        """XADD `events` (job id, event) in order, set the result TTL on the streams in
        `expire` (a stream's first and last writes), and return the status of each job in
        `watch` (None: its hash is gone)."""
        if not events and not watch:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id, event in events:
                fields: dict[Any, Any] = dict(event.encode())
                pipe.xadd(self.keys.tokens(job_id), fields)
            for job_id in expire:
                pipe.expire(self.keys.tokens(job_id), self.ttl_s)
            for job_id in watch:
                pipe.hget(self.keys.job(job_id), "status")
            replies = await pipe.execute()
        statuses = replies[len(replies) - len(watch) :]
        return {
            job_id: None if status is None else as_text(status)
            for job_id, status in zip(watch, statuses, strict=True)
        }
