"""Console sessions still open, by nonce: each lapses once unused for the idle timeout
(CONVEYOR_CONSOLE_IDLE_TIMEOUT_S), or when logged out of. A session cookie is signed, not
stored, and lasted its 12 hours whatever happened: a console left signed in on a shared machine,
or a copy of its cookie (a proxy's log), opened it all day though nobody had used it since the
morning. Every request and each live-feed recheck renews its session in the command that
checks it (EXPIRE answers whether the key was there), so an open page keeps its session."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.keys import Keys


class LiveSessions:
    def __init__(self, client: aioredis.Redis, keys: Keys, idle_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.idle_s = idle_s

    async def open(self, nonce: str) -> None:
        await self.redis.set(self.keys.console_session(nonce), 1, ex=self.idle_s)

    async def renewed(self, nonce: str) -> bool:
        """Whether the session is still open; if it is, it lives idle_s from now."""
        return bool(await self.redis.expire(self.keys.console_session(nonce), self.idle_s))

    async def close(self, nonce: str) -> None:
        await self.redis.delete(self.keys.console_session(nonce))
