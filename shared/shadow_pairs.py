"""The one owner of shadow pairs in Redis: a primary job and its shadow copy wait in
`cv:{ctl}shadow:{model}:pending` (sorted set by submit ms) until both ended; the look that
compares them claims them into `…:pending:claimed` (sorted set by claim ms), stores their
comparisons beside the primaries as `cv:{ctl}shadow:{primary id}` (hash, result TTL; a key the
job API never reads, so a shadow result cannot reach the client), each with its page under
fields named by its shadow variant (a request copied to two shadows has two pairs and one
primary), with the page's counts per shadow variant (`cv:{ctl}shadowpage:{page}`), adds those
counts, then releases the claims and forgets the page. A claim not released within
SETTLE_WITHIN_MS (its look failed: a Redis error) goes back to pending and a later look settles
it: compared again if no result is stored, else only the counts of its page still kept are added
again, once per variant at most (the counters' slot keeps the variants a page was added to). So
a pair is counted once, not lost, across failures; only a look that stalls longer than
SETTLE_WITHIN_MS between claiming and storing can have its pairs compared and counted by a
second look too. Both sets expire `ttl_s` after the last look that read them or the last copy
added to them (each renews it): a model taken out of the repository is looked at no more, and its
sets stayed for ever; so did a pending set no look ever read (no leader ran the comparisons).
Pairs that expire so were never counted: their jobs' records expire as soon (result TTL), and a
pair whose jobs are gone cannot be compared."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared.codec import as_text, dumps, loads
from shared.job_store import now_ms
from shared.keys import Keys
from shared.rate_limit import RateLimiter
from shared.redis_client import executed
from shared.shadow_compare import FIELDS

SETTLE_WITHIN_MS = 60_000  # a page settles in milliseconds; a claim this old was abandoned

# KEYS[1]=pending; ARGV[1]=submit ms, ARGV[2]=the set's ttl, ARGV[3]=the pair. Adds the pair and
# renews the set's ttl in one command (the ZADD it replaces), so a set is never without one: one
# created and never looked at (`_PENDING` renews it) was kept for ever.
_ADD = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[2])
"""

# KEYS[1]=pending, KEYS[2]=claimed, KEYS[3]=the call's reply, kept for its rerun; ARGV[1]=now
# ms, ARGV[2]=the sets' ttl, ARGV[3]=how many pairs to drop, ARGV[4]=ms the reply is kept, then
# the members to drop, then those to claim. Removes the first from pending; moves each of the
# rest that is still pending into claimed (its ttl renewed, as `_PENDING` does); a 1 per member
# this call removed (dropped or moved), else 0. A rerun (the client resends a script whose reply
# was lost) answers the first run's reply: it found its own pairs gone, and its look counted
# none of them, left claimed until SETTLE_WITHIN_MS put them back.
_TAKE = """
local kept = redis.call('GET', KEYS[3])
if kept then return cjson.decode(kept) end
local drops = tonumber(ARGV[3])
local removed, claimed = {}, false
for i = 5, #ARGV do
  local gone = redis.call('ZREM', KEYS[1], ARGV[i])
  if gone == 1 and i > 4 + drops then
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
    claimed = true
  end
  table.insert(removed, gone)
end
if claimed then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
redis.call('SET', KEYS[3], cjson.encode(removed), 'PX', ARGV[4])
return removed
"""

# KEYS[1]=pending, KEYS[2]=claimed; ARGV: claims at or before this ms are abandoned, first rank,
# last rank, the sets' ttl. Puts abandoned claims back in pending (scored by their claim ms),
# renews both sets' ttl (a copy renews pending's in `_ADD`, no command of its own), then reads
# the page: {member, score, ...}.
_PENDING = """
local stale = redis.call('ZRANGE', KEYS[2], '-inf', ARGV[1], 'BYSCORE', 'WITHSCORES')
for i = 1, #stale, 2 do
  redis.call('ZADD', KEYS[1], 'NX', stale[i + 1], stale[i])
  redis.call('ZREM', KEYS[2], stale[i])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'WITHSCORES')
"""


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


Totals = dict[str, dict[str, float]]  # a page's counts per shadow variant
Results = Sequence[tuple[ShadowPair, Mapping[str, str]]]  # each pair's comparison fields


class ShadowPairs:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        ttl_s: int,
        settle_within_ms: int = SETTLE_WITHIN_MS,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.settle_within_ms = settle_within_ms
        self._add = client.register_script(_ADD)
        self._take = client.register_script(_TAKE)
        self._pending = client.register_script(_PENDING)

    async def add(self, model: str, pair: ShadowPair) -> None:
        """Record a pair as its copy is made, its set's TTL renewed (`_ADD`)."""
        await self._add(
            keys=[self.keys.shadow_pairs(model)], args=[now_ms(), self.ttl_s, pair.member()]
        )

    async def remove(self, model: str, pair: ShadowPair) -> None:
        """Forget a pair whose shadow copy was refused (its lane full): nothing to compare."""
        await self.redis.zrem(self.keys.shadow_pairs(model), pair.member())

    async def pending(self, model: str, limit: int, start: int = 0) -> list[tuple[ShadowPair, int]]:
        """`limit` pairs not yet compared, oldest first from rank `start`, with their submit ms
        (claim ms for one put back): abandoned claims go back first, in the same script."""
        rows = await self._pending(
            keys=self._keys(model),
            args=[now_ms() - self.settle_within_ms, start, start + limit - 1, self.ttl_s],
        )
        pairs = zip(rows[::2], rows[1::2], strict=True)
        return [(ShadowPair.of(member), int(float(score))) for member, score in pairs]

    async def take(
        self, model: str, pairs: Sequence[ShadowPair], drop: Sequence[ShadowPair] = ()
    ) -> tuple[list[bool], list[bool]]:
        """Claim `pairs` and remove `drop` (nothing to count) from those pending, in one script
        (the sets are in one slot); for each of `pairs`, then of `drop`, True for the one caller
        that claimed or dropped it, the one to settle or count it (two leaders a lapsed lease let
        overlap counted it twice). Claimed rather than removed: a page that failed after
        removing its pairs lost them uncounted; a claim lasts until `done` releases it or,
        abandoned, it goes back to pending. Nothing to claim or drop sends nothing: every look
        of every model (twice a second) wrote the call's reply key, kept RERUN_MS, for none."""
        members = [pair.member() for pair in (*drop, *pairs)]
        if not members:
            return [], []
        head = [now_ms(), self.ttl_s, len(drop), RateLimiter.RERUN_MS]
        pending, claims = self._keys(model)
        reply = f"{claims}:call:{uuid.uuid4().hex[:16]}"  # the sets' slot
        removed = await self._take(keys=[pending, claims, reply], args=[*head, *members])
        flags = [bool(flag) for flag in removed]
        return flags[len(drop) :], flags[: len(drop)]

    async def compared(
        self, pairs: Sequence[ShadowPair]
    ) -> tuple[set[ShadowPair], dict[str, Totals]]:
        """Of claimed `pairs`, those compared before (their result is stored: their page failed
        after `store`), and the counts of those pages not yet forgotten, by page: to add
        again (once per variant, VariantStats.add_counts_once), never to compare again. The page
        is read under the pair's shadow variant: with one `page` field for all of a primary's
        pairs, a second shadow's pair that ended a look after the first's read as compared, and
        was never counted."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for pair in pairs:
                pipe.hget(self.keys.shadow_result(pair.primary_id), _named("page", pair))
            named = await executed(pipe)
        before = {pair for pair, page in zip(pairs, named, strict=True) if page is not None}
        pages = sorted({as_text(page) for page in named if page is not None})
        async with self.redis.pipeline(transaction=False) as pipe:
            for page in pages:
                pipe.hgetall(self.keys.shadow_page(page))
            kept = await executed(pipe)
        return before, {
            page: {as_text(variant): loads(counts) for variant, counts in totals.items()}
            for page, totals in zip(pages, kept, strict=True)
        }

    async def store(self, page: str, totals: Totals, results: Results) -> None:
        """Keep each comparison beside its primary, as long as jobs are kept, naming `page`, and
        the page's counts until `done` forgets it: one transaction (all share `{ctl}`'s slot),
        so none is left without its TTL and no result without the counts it adds."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for pair, comparison in results:
                key = self.keys.shadow_result(pair.primary_id)
                pipe.hset(key, items=_flat(_result_fields(page, pair, comparison)))
                if absent := [name for name in FIELDS if name not in comparison]:
                    pipe.hdel(key, *absent)  # else the unnamed one kept an earlier shadow's
                pipe.expire(key, self.ttl_s)
            kept = [part for variant, counts in totals.items() for part in (variant, dumps(counts))]
            pipe.hset(self.keys.shadow_page(page), items=kept)
            pipe.expire(self.keys.shadow_page(page), self.ttl_s)
            await executed(pipe)

    async def done(self, model: str, pairs: Sequence[ShadowPair], pages: Iterable[str]) -> None:
        """Release the claims of `pairs` (all settled, compared or not) and forget `pages`,
        whose counts were all added: one transaction, so a claim a failure left behind still
        finds its page's counts, for a later look to add those missing."""
        forgotten = [self.keys.shadow_page(page) for page in pages]
        async with self.redis.pipeline(transaction=True) as pipe:
            if pairs:
                pipe.zrem(self._keys(model)[1], *(pair.member() for pair in pairs))
            if forgotten:
                pipe.delete(*forgotten)
            await executed(pipe)

    async def result(self, primary_id: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.keys.shadow_result(primary_id))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def _keys(self, model: str) -> list[str]:
        """Pending, then its claimed pairs (one slot: both carry `{ctl}`)."""
        return [self.keys.shadow_pairs(model), self.keys.shadow_claims(model)]


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [part for item in fields.items() for part in item]


def _result_fields(page: str, pair: ShadowPair, comparison: Mapping[str, str]) -> dict[str, str]:
    """A primary's result fields for its pair with `pair`'s shadow variant: the shadow's id and
    comparison named by the variant (`agree:mirror`), and its `page`; then the same unnamed, with
    both variants, the shape a result of one shadow had. Unnamed only, the second shadow of a
    request compared wrote over the first's comparison, lost to whoever read the result; the
    unnamed fields are still the last compared shadow's, and `store` drops those it lacks."""
    compared = {"shadow_id": pair.shadow_id, **comparison}
    named = {_named(name, pair): value for name, value in {**compared, "page": page}.items()}
    variants = {"primary_variant": pair.primary_variant, "shadow_variant": pair.shadow_variant}
    return {**named, **variants, **compared}


def _named(field: str, pair: ShadowPair) -> str:
    """`field` of a primary's result as kept for its pair with `pair`'s shadow variant."""
    return f"{field}:{pair.shadow_variant}"
