"""A lane's webhooks-owed set (`Keys.webhooks_owed`), the one owner of its client-side commands.

A job with a webhook ends owing its event: the script that ends it (FINISH, RECLAIM's dead
letter, the API's cancel through TRANSITION) adds its id, scored by the ms it ended
(shared/job_scripts.py, `owe`), in the same step as the end. Whoever hands the event to the
broker then settles it (the writer, the reclaimer, the producer's cancel), and the reclaimer
re-sends what stays overdue: its sender died in between (docs/architecture.md, "Webhooks").
Errors are raised: each caller decides what an event left owed costs it."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from shared.codec import as_text
from shared.keys import Keys
from shared.redis_client import RedisClient


class WebhookOutbox:
    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    async def settle(self, stream: str, job_ids: Collection[str]) -> None:
        """Take jobs whose events the broker has off the lane's owed set, in one ZREM (none for
        no ids: a micro-batch without webhooks costs nothing)."""
        if job_ids:
            await self.redis.zrem(self.keys.webhooks_owed(stream), *job_ids)

    async def overdue(self, stream: str, ended_by_ms: int, limit: int) -> list[str]:
        """Ids of the lane's jobs owed since `ended_by_ms` (epoch ms) or before, oldest first,
        at most `limit`."""
        key = self.keys.webhooks_owed(stream)
        owed: list[Any] = await self.redis.zrangebyscore(key, "-inf", ended_by_ms, 0, limit)
        return [as_text(job_id) for job_id in owed]
