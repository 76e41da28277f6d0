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
PAGE_ROUNDS = 4  # reads after which a page that has found records is answered as it stands
# Ids one read of a page or one UNLIST call takes: a look reads each id read, and a script holds
# Redis for every client as it runs.
CHUNK = 1_000

# KEYS[1]=a tenant's index, KEYS[2]=the ids unlisted from it, by the same scores: the prelude of
# every script on them. KEYS[2] as releases before 2026-12-02 left it (a hash of the same scores,
# never pruned, and with no TTL once its tenant had deleted all it listed) is made the sorted set
# it now is, so a cursor given out before keeps its place and the key a TTL from then on.
# `trim(now, keep)`, the one place entries leave the index by age: those past `keep` s (no record
# lives longer) are unlisted with their scores, each once, and a score is dropped `keep` after
# that, the key with the last: a cursor outlives its entry by a lifetime. Dropped with its entry,
# a cursor aged past the cut-off by the next page (an upload or another listing trimmed it
# between) lost its place, and that page was empty and final, records left.
_PRELUDE = """
if redis.call('TYPE', KEYS[2]).ok == 'hash' then
  local flat = redis.call('HGETALL', KEYS[2])
  redis.call('DEL', KEYS[2])
  for i = 1, #flat, 2 do redis.call('ZADD', KEYS[2], flat[i + 1], flat[i]) end
end
local function trim(now, keep)
  local cut_off = now - keep * 1000
  local aged = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cut_off, 'WITHSCORES')
  for i = 1, #aged, 2 do redis.call('ZADD', KEYS[2], aged[i + 1], aged[i]) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut_off)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cut_off - keep * 1000)
  redis.call('EXPIRE', KEYS[2], 2 * keep)
end
"""

# ARGV: now (ms), how long a record is listed (s), the id, its record's creation (ms): the
# score it lists by, as OpenAI's lists order by `created_at` (scored at `now`, a batch whose create
# ran long listed as newer than ones created after it). The index lives as long as what it lists.
ENLIST = (
    _PRELUDE
    + """
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
trim(tonumber(ARGV[1]), tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# ARGV: now (ms), how long a record is listed (s), how many, 1 for newest first (else oldest
# first), the id to list after (none: from the first). Trimmed, ranked and read on from in one
# step: in two round trips, a record indexed between them (a newer one shifts every rank up)
# would put `after` itself on the page again. An `after` no longer listed (deleted, its record
# gone and dropped by a listing, or trimmed) is put back by its score for the step, so it is
# ranked among the ones of its own ms as it was: the page after it was empty, and a client
# listing page by page (deleting what it lists) stopped with records left.
LISTED = (
    _PRELUDE
    + """
trim(tonumber(ARGV[1]), tonumber(ARGV[2]))
local count = tonumber(ARGV[3])
local range = ARGV[4] == '1' and 'ZREVRANGE' or 'ZRANGE'
local after = ARGV[5]
if not after then return redis.call(range, KEYS[1], 0, count - 1) end
local score = redis.call('ZSCORE', KEYS[1], after) or redis.call('ZSCORE', KEYS[2], after)
if not score then return {} end
local put_back = redis.call('ZADD', KEYS[1], 'NX', score, after)
local rank = redis.call(ARGV[4] == '1' and 'ZREVRANK' or 'ZRANK', KEYS[1], after)
local ids = redis.call(range, KEYS[1], rank + 1, rank + count)
if put_back == 1 then redis.call('ZREM', KEYS[1], after) end
return ids
"""
)

# ARGV: now (ms), how long a record is listed (s), the ids. Each leaves the index and keeps its
# score beside it (LISTED), as `trim` keeps those it unlists (the key was given the index's TTL
# read after the index could be gone, so a tenant who deleted all it listed left the key for
# good, and an active tenant's never shrank).
UNLIST = (
    _PRELUDE
    + """
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score then
    redis.call('ZADD', KEYS[2], score, ARGV[i])
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
trim(tonumber(ARGV[1]), tonumber(ARGV[2]))
return 1
"""
)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a tenant's records: (id, what was found for it) pairs, and whether more
    follow; an empty one is the last (OpenAI's clients stop at it, whatever `has_more` says)."""

    found: list[tuple[str, T]]
    more: bool


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
    def _enlist(self) -> AsyncScript:
        """Registered once per store: `register_script` hashes the script each time."""
        return self.redis.register_script(ENLIST)

    @cached_property
    def _listed(self) -> AsyncScript:
        return self.redis.register_script(LISTED)

    @cached_property
    def _unlist(self) -> AsyncScript:
        return self.redis.register_script(UNLIST)

    def _keys(self, tenant: str) -> list[str]:
        return [self.index_of(tenant), self.unlisted_of(tenant)]

    async def enlist(self, tenant: str, record_id: str, at_ms: int | None = None) -> None:
        """Index the record under its tenant by its creation, `at_ms` (default now), in one
        round trip."""
        now = now_ms()
        args = [now, self.listed_for_s, record_id, now if at_ms is None else at_ms]
        await call_script(self._enlist, self._keys(tenant), args)

    async def listed(
        self, tenant: str, after: str | None, count: int, newest_first: bool = True
    ) -> list[str]:
        """Up to `count` of the tenant's ids, newest (or oldest) first, from the one after
        `after`, in one round trip."""
        args = [now_ms(), self.listed_for_s, count, int(newest_first), *([after] if after else [])]
        ids: list[Any] = await call_script(self._listed, self._keys(tenant), args)
        return [as_text(record_id) for record_id in ids]

    async def unlist(self, tenant: str, record_ids: list[str]) -> None:
        """Records deleted, or whose keys expired before their index entries, `CHUNK` to a
        call."""
        keys = self._keys(tenant)
        for start in range(0, len(record_ids), CHUNK):
            chunk = record_ids[start : start + CHUNK]
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
        `limit` (id, what `look` found for it: `look` takes the ids of a read at once), and whether
        more follow. Ones that `look` finds gone (None) leave the index before the next read,
        which fills the page from the ones after them, taking as many more as were gone so far
        (at most `CHUNK`): each dead entry is read once. After `PAGE_ROUNDS` reads a page that
        has found records is answered as it stands, `has_more` true, a client going on after
        its last record; one that has found none reads on until it finds one or the index
        ends, as an empty page ends OpenAI's clients' listing."""
        found: list[tuple[str, T]] = []
        passed = 0  # entries read whose records were gone
        rounds = 0
        while True:
            wanted = min(limit + 1 - len(found) + passed, CHUNK)
            ids = await self.listed(tenant, after, wanted, newest_first)
            gone: list[str] = []
            for record_id, record in zip(ids, await look(ids), strict=True):
                if record is None:
                    gone.append(record_id)
                else:
                    found.append((record_id, record))
            await self.unlist(tenant, gone)
            passed, rounds = passed + len(gone), rounds + 1
            if len(ids) < wanted:
                return Page(found[:limit], len(found) > limit)
            if len(found) > limit or (found and rounds >= PAGE_ROUNDS):
                return Page(found[:limit], True)
            after = ids[-1]
