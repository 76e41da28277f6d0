"""Console sessions ended by logging out. A session cookie is signed, not stored, so deleting it
in the browser would leave any copy of it (a shared machine, a proxy's log) valid for the rest
of its 12 hours; the producer keeps each logged-out session's nonce until then instead."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import Keys


class Logouts:
    def __init__(self, client: aioredis.Redis, keys: Keys, keep_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.keep_s = keep_s  # as long as a session lasts: no cookie outlives its mark

    async def record(self, nonce: str) -> None:
        await self.redis.set(self.keys.console_logout(nonce), 1, ex=self.keep_s)

    async def ended(self, nonce: str) -> bool:
        return bool(await self.redis.exists(self.keys.console_logout(nonce)))
