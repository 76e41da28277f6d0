"""Console sessions still open, by nonce: each lapses once unused for the idle timeout
(CONVEYOR_CONSOLE_IDLE_TIMEOUT_S), or when logged out of. A session cookie is signed, not
stored, and lasted its 12 hours whatever happened: a console left signed in on a shared machine,
or a copy of its cookie (a proxy's log), opened it all day though nobody had used it since the
morning. Every request and each live-feed recheck renews its session in the command that
checks it (GETEX answers what the key held), so an open page keeps its session.

Each record holds the id of the key it was opened for: the cookie's signature alone bound its
key id to its nonce, so whoever knew the signing secret (the development manifests' value, a
leaked one) paired an admin key's public id with their own read-only session's nonce."""

from __future__ import annotations

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.keys import Keys


class LiveSessions:
    def __init__(self, client: aioredis.Redis, keys: Keys, idle_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.idle_s = idle_s

    async def open(self, nonce: str, key_id: str) -> None:
        await self.redis.set(self.keys.console_session(nonce), key_id, ex=self.idle_s)

    async def renewed(self, nonce: str, key_id: str) -> bool:
        """Whether the session is still open, and opened for `key_id`; if it is open, it lives
        idle_s from now."""
        held = await self.redis.getex(self.keys.console_session(nonce), ex=self.idle_s)
        return held is not None and as_text(held) == key_id

    async def close(self, nonce: str) -> None:
        await self.redis.delete(self.keys.console_session(nonce))
