"""What a tenant lists (its batches, its uploaded files), for OpenAI's list routes: a sorted set
per tenant of ids scored by creation time in ms, in the control plane's slot. An entry does not
expire with the key it names, so a page drops the entries its lookups find gone (a store whose
records are deleted unlists them then)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from shared.codec import as_text
from shared.job_store import now_ms
from shared.redis_client import call_script

T = TypeVar("T")
PAGE_ROUNDS = 4  # reads one page makes at most, however many gone entries it passes
UNLIST_CHUNK = 1_000  # ids one UNLIST call takes: a script holds Redis for every client as it runs

# KEYS[2] as releases before 2026-12-02 left it: a hash of the same scores, never pruned, and with
# no TTL once its tenant had deleted all it listed. Made the sorted set it now is on first use,
# so a cursor given out before keeps its place and the key its TTL from then on.
_FROM_HASH = """
if redis.call('TYPE', KEYS[2]).ok == 'hash' then
  local flat = redis.call('HGETALL', KEYS[2])
  redis.call('DEL', KEYS[2])
  for i = 1, #flat, 2 do redis.call('ZADD', KEYS[2], flat[i + 1], flat[i]) end
end
"""

# KEYS[1]=a tenant's index, KEYS[2]=the scores of ids unlisted from it; ARGV: the id to list after,
# how many, 1 for newest first (else oldest first), the score at or below which entries outlived
# any record (they leave the index first, as `enlist` drops them: unlisted, their scores would go
# at once, and a page after one would list nothing). Ranked and read on from in one step: in two
# round trips, a record indexed between them (a newer one shifts every rank up) would put `after`
# itself on the page again. An `after` no longer listed (deleted, its record gone and dropped by
# a listing, or past the cut-off) is put back by its score for the step, so it is ranked among
# the ones of its own ms as it was: the page after it was empty, and a client listing page by
# page (deleting what it lists) stopped with records left.
LISTED_AFTER = (
    _FROM_HASH
    + """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return {} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[4])
local put_back = redis.call('ZADD', KEYS[1], 'NX', score, ARGV[1])
local rank = redis.call(ARGV[3] == '1' and 'ZREVRANK' or 'ZRANK', KEYS[1], ARGV[1])
local range = ARGV[3] == '1' and 'ZREVRANGE' or 'ZRANGE'
local ids = redis.call(range, KEYS[1], rank + 1, rank + tonumber(ARGV[2]))
if put_back == 1 then redis.call('ZREM', KEYS[1], ARGV[1]) end
return ids
"""
)

# KEYS[1]=a tenant's index, KEYS[2]=the ids unlisted from it (sorted set, by the same scores);
# ARGV: now (ms), how long a record is listed (s), the ids. Each leaves the index and keeps its
# score beside it (LISTED_AFTER) for as long as a record is listed: older ones are dropped, and
# the key expires then (it was given the index's TTL read after the index could be gone, so a
# tenant who deleted all it listed left the key for good, and an active tenant's never shrank).
UNLIST = (
    _FROM_HASH
    + """
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score then
    redis.call('ZADD', KEYS[2], score, ARGV[i])
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
local keep = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[1]) - keep * 1000)
redis.call('EXPIRE', KEYS[2], keep)
return 1
"""
)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a tenant's records: (id, what was found for it) pairs, whether more follow,
    and `last_id`, the id the next page goes on after (OpenAI's cursor): the last record's, or,
    for a page that stopped early having found none, the last entry it read (its score is kept
    while it is unlisted, so `after` it keeps its place); None when nothing was read."""

    found: list[tuple[str, T]]
    more: bool
    last_id: str | None


class TenantIndexed(ABC):
    """Mixed into a store whose records a tenant lists; `index_of` names a tenant's index."""

    redis: aioredis.Redis

    @abstractmethod
    def index_of(self, tenant: str) -> str:
        """The tenant's index key."""

    @abstractmethod
    def unlisted_of(self, tenant: str) -> str:
        """The key of the ids unlisted from the tenant's index (its slot)."""

    @property
    @abstractmethod
    def listed_for_s(self) -> int:
        """How long a record is listed: the longest one lives."""

    @cached_property
    def _listed_after(self) -> AsyncScript:
        """Registered once per store: `register_script` hashes the script each time."""
        return self.redis.register_script(LISTED_AFTER)

    @cached_property
    def _unlist(self) -> AsyncScript:
        return self.redis.register_script(UNLIST)

    async def enlist(self, tenant: str, record_id: str) -> None:
        """Index the record under its tenant; entries older than `listed_for_s` are dropped,
        so the index stays as long as what it lists."""
        key, now, keep_s = self.index_of(tenant), now_ms(), self.listed_for_s
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {record_id: now})
            pipe.zremrangebyscore(key, "-inf", now - keep_s * 1000)
            pipe.expire(key, keep_s)
            await pipe.execute()

    async def listed(
        self, tenant: str, after: str | None, count: int, newest_first: bool = True
    ) -> list[str]:
        """Up to `count` of the tenant's ids, newest (or oldest) first, from the one after
        `after`."""
        key, cut_off = self.index_of(tenant), now_ms() - self.listed_for_s * 1000
        if after is None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(key, "-inf", cut_off)
                (pipe.zrevrange if newest_first else pipe.zrange)(key, 0, count - 1)
                ids: list[Any] = (await pipe.execute())[1]
        else:
            keys = [key, self.unlisted_of(tenant)]
            args = [after, count, int(newest_first), cut_off]
            ids = await call_script(self._listed_after, keys, args)
        return [as_text(record_id) for record_id in ids]

    async def unlist(self, tenant: str, record_ids: list[str]) -> None:
        """Records deleted, or whose keys expired before their index entries, `UNLIST_CHUNK`
        to a call."""
        keys = [self.index_of(tenant), self.unlisted_of(tenant)]
        for start in range(0, len(record_ids), UNLIST_CHUNK):
            chunk = record_ids[start : start + UNLIST_CHUNK]
            await call_script(self._unlist, keys, [now_ms(), self.listed_for_s, *chunk])

    async def page(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        look: Callable[[list[str]], Awaitable[Sequence[T | None]]],
        newest_first: bool = True,
    ) -> Page[T]:
        """The tenant's records, newest (or oldest) first, from the one after `after`: up to
        `limit` (id, what `look` found for it: `look` reads a page's ids at once), and whether
        more follow. One that `look` finds gone (None) leaves the index, and the page is filled
        from the ones after it, each read taking as many more as were gone so far; after
        `PAGE_ROUNDS` reads the page is answered as it stands, `has_more` true, its `last_id`
        the last entry read when it found none: an index of expired entries cost one request a
        round trip per page of them, and an empty page without a cursor sent a client back to
        the start."""
        found: list[tuple[str, T]] = []
        gone: list[str] = []
        exhausted = False
        for _ in range(PAGE_ROUNDS):
            wanted = limit + 1 - len(found) + len(gone)
            ids = await self.listed(tenant, after, wanted, newest_first)
            for record_id, record in zip(ids, await look(ids), strict=True):
                if record is None:
                    gone.append(record_id)
                else:
                    found.append((record_id, record))
            exhausted = len(ids) < wanted
            if exhausted or len(found) > limit:
                break
            after = ids[-1]
        await self.unlist(tenant, gone)
        more = len(found) > limit or not exhausted
        if found:
            return Page(found[:limit], more, found[:limit][-1][0])
        return Page([], more, after if more else None)  # `after`: the last entry read
