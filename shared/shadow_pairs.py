"""The one owner of shadow pairs in Redis: a primary job and its shadow copy wait in
`cv:{ctl}shadow:{model}:pending` (sorted set by submit ms) until both ended; their comparison
is then stored beside the primary as `cv:{ctl}shadow:{primary id}` (hash, result TTL), a key
the job API never reads, so a shadow result cannot reach the client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from shared.codec import as_text, dumps, loads
from shared.job_store import now_ms
from shared.keys import Keys
from shared.redis_client import executed


@dataclass(frozen=True, slots=True)
class ShadowPair:
    primary_id: str
    shadow_id: str
    primary_variant: str
    shadow_variant: str

    def member(self) -> bytes:
        return dumps([self.primary_id, self.shadow_id, self.primary_variant, self.shadow_variant])

    @classmethod
    def of(cls, member: bytes | str) -> ShadowPair:
        primary_id, shadow_id, primary_variant, shadow_variant = loads(member)
        return cls(primary_id, shadow_id, primary_variant, shadow_variant)


class ShadowPairs:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    async def add(self, model: str, pair: ShadowPair) -> None:
        await self.redis.zadd(self.keys.shadow_pairs(model), {pair.member(): now_ms()})

    async def pending(self, model: str, limit: int, start: int = 0) -> list[tuple[ShadowPair, int]]:
        """`limit` pairs not yet compared, oldest first from rank `start`, with their submit ms."""
        key, last = self.keys.shadow_pairs(model), start + limit - 1
        rows = await self.redis.zrange(key, start, last, withscores=True)
        return [(ShadowPair.of(row[0]), int(row[1])) for row in cast(list[Any], rows)]

    async def take(self, model: str, pairs: Sequence[ShadowPair]) -> list[bool]:
        """Remove the pairs from those pending, in one round trip (the set is in one slot);
        each True for the one caller that removed it, the one to count it (two leaders a lapsed
        lease let overlap, or a look rerun after a Redis blip between counting and removing,
        counted it twice)."""
        key = self.keys.shadow_pairs(model)
        async with self.redis.pipeline(transaction=False) as pipe:
            for pair in pairs:
                pipe.zrem(key, pair.member())
            return [bool(removed) for removed in await executed(pipe)]

    async def store(self, results: Sequence[tuple[ShadowPair, Mapping[str, str]]]) -> None:
        """Keep each comparison beside its primary, as long as jobs are kept: one transaction
        (the results share `{ctl}`'s slot), so none is left without its TTL."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for pair, fields in results:
                key = self.keys.shadow_result(pair.primary_id)
                pipe.hset(key, items=["shadow_id", pair.shadow_id, *_flat(fields)])
                pipe.expire(key, self.ttl_s)
            await executed(pipe)

    async def result(self, primary_id: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.keys.shadow_result(primary_id))
        return {as_text(k): as_text(v) for k, v in raw.items()}


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [part for item in fields.items() for part in item]
