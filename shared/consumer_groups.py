"""The one place that creates consumer groups: at id 0, so entries added before any worker
existed are served, keeping a group that exists already (BUSYGROUP) as it is. The producer
creates every partition's groups up front (so lag is measurable before any worker runs); a
worker creates its own at start and again when Redis lost them (NOGROUP)."""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.keys import GROUP


async def ensure_groups(client: aioredis.Redis, streams: Iterable[str]) -> None:
    for stream in streams:
        try:
            await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
