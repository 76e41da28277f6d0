"""Per-key quotas shared by every producer replica: a token bucket (requests per second with a
burst), a cap on jobs in flight and one on open event streams. Each decision is one Lua script
on Redis's clock, so two replicas racing for the last token cannot both win and skewed host
clocks do not matter."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.codec import as_text
from shared.job_states import TERMINAL, JobStatus
from shared.keys import Keys
from shared.redis_client import call_script

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1]=bucket, KEYS[2]=the request's verdict; ARGV: rate per second, burst, cost, ms the
# verdict is kept. Returns {allowed (0|1), tokens left (floored), ms until one more token, ms
# until the bucket is full}. A request whose verdict is kept is not charged again, and keeps it
# (refused too): its rerun after the reply was lost (redis-py resends through a dropped
# connection, group commit its whole flush) took a second token, a false 429 at the burst.
# One SET NX per call finds a rerun: five commands a call (TIME, HMGET, SET, HSET, PEXPIRE),
# a rerun GET in place of HSET. The bucket is stamped with now, not the later of now and its
# stamp: once Redis's clock stepped back (a failover to a replica behind it) it refilled nothing
# until the clock caught up, whatever Retry-After said. It never holds more than the burst, even
# one filled at a higher burst (a lowered default rolled out beside replicas that had the old).
# Its tokens are stored with 17 significant digits, a double's all: `tostring` keeps 14, so a
# bucket of 10^8 tokens or more kept them to 1e-5 at best: a slow rate taken often never refilled.
TOKEN_BUCKET = (
    _NOW_MS
    + """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local allowed = 0
if tokens >= cost then allowed = 1 end
if redis.call('SET', KEYS[2], allowed, 'NX', 'PX', ARGV[4]) then
  tokens = tokens - allowed * cost
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', now)
else
  allowed = tonumber(redis.call('GET', KEYS[2]))
end
local full_ms = math.ceil((burst - tokens) * 1000 / rate)
redis.call('PEXPIRE', KEYS[1], full_ms + 1000)
local next_ms = 0
if tokens < cost then next_ms = math.ceil((cost - tokens) * 1000 / rate) end
return {allowed, math.floor(tokens), next_ms, full_ms}
"""
)

# KEYS[1]=in-flight set, KEYS[2]=rescan marker; ARGV: cap, job id, ttl ms, scan. Below the cap
# the job is added at once. At the cap it is refused, with the members the caller should check
# for jobs that ended (`scan` > 0): the oldest `scan` always, the whole set at most once a second.
# The job hashes live in their partitions' slots, so the caller reads them, not this script.
# Returns {admitted (0|1), now ms, members to check with their admission ms (flat)}. A job the
# set holds already is admitted: the call rerun after its reply was lost (redis-py resends
# through a dropped connection) was refused at the cap its own first run filled.
IN_FLIGHT = (
    _NOW_MS
    + """
local cap, scan = tonumber(ARGV[1]), tonumber(ARGV[4])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return {1, now, {}} end
if redis.call('ZCARD', KEYS[1]) < cap then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, now, {}}
end
if scan == 0 then return {0, now, {}} end
local last = scan - 1
if redis.call('SET', KEYS[2], 1, 'NX', 'PX', 1000) then last = -1 end
return {0, now, redis.call('ZRANGE', KEYS[1], 0, last, 'WITHSCORES')}
"""
)
# KEYS[1]=in-flight set; ARGV: the job ids whose slots are freed. Returns how many it held. A
# script, not a ZREM, so that group commit waits for no replica for it either (its `_UNACKED`):
# a removal lost in a failover costs a slot until the prune at the cap. One ZREM per id: a
# prune may free the whole set, more ids than Lua's unpack takes.
RELEASE = """
local freed = 0
for _, job_id in ipairs(ARGV) do freed = freed + redis.call('ZREM', KEYS[1], job_id) end
return freed
"""
# KEYS[1]=a key's open event streams; ARGV: cap, stream id, ms a member lives unrenewed. Drops
# the members not renewed that long (their producer died before removing them), then holds the
# stream: a member already is renewed (its score: now), a new one is added below the cap. Both
# an open and each renewal are this script: a renewal the set lost meanwhile (Redis paused past
# the lapse) takes its place back if there is room. Returns 1 if the set holds the stream now.
# A member renewed ahead of now (Redis's clock stepped back: a failover to a replica behind it)
# is stamped now first, so that it lapses unrenewed as any other, not once the clock caught up.
HOLD_STREAM = (
    _NOW_MS
    + """
local cap, lapse = tonumber(ARGV[1]), tonumber(ARGV[3])
for _, ahead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  redis.call('ZADD', KEYS[1], now, ahead)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - lapse)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= cap then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], lapse)
return 1
"""
)
_LIVE = frozenset(s.value for s in JobStatus if s not in TERMINAL)


@dataclass(frozen=True, slots=True)
class Quota:
    """One key's limits: `rate_per_s` with bursts of `burst`, at most `max_in_flight` jobs and
    `max_streams` job-event streams open."""

    rate_per_s: float
    burst: int
    max_in_flight: int
    max_streams: int


@dataclass(frozen=True, slots=True)
class BucketState:
    allowed: bool
    limit: int
    remaining: int
    retry_after_s: int
    reset_s: int

    def headers(self) -> dict[str, str]:
        """IETF `RateLimit-*` fields (draft-ietf-httpapi-ratelimit-headers) plus Retry-After."""
        out = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset_s),
        }
        if not self.allowed:
            out["Retry-After"] = str(self.retry_after_s)
        return out


class RateLimiter:
    # How long a verdict is kept for a rerun: past redis-py's retries of a dropped connection
    # (3, each a backoff under 1 s and a connect of CONVEYOR_REDIS_TIMEOUT_S, 2 s by default).
    RERUN_MS = 10_000

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._bucket = client.register_script(TOKEN_BUCKET)

    async def take(self, key_id: str, quota: Quota, request_id: str | None = None) -> BucketState:
        """Take one token from the key's bucket; `allowed` is False when it is empty. The
        request is charged once however often its call is resent; `request_id` (unique, a
        random one by default) names it."""
        keys = [
            self.keys.rate_bucket(key_id),
            self.keys.rate_verdict(key_id, request_id or uuid.uuid4().hex[:16]),
        ]
        allowed, remaining, next_ms, full_ms = await call_script(
            self._bucket, keys, [quota.rate_per_s, quota.burst, 1, self.RERUN_MS]
        )
        return BucketState(
            allowed=bool(allowed),
            limit=quota.burst,
            remaining=int(remaining),
            retry_after_s=max(1, math.ceil(int(next_ms) / 1000)),
            reset_s=math.ceil(int(full_ms) / 1000),
        )


class InFlightLimiter:
    """Jobs a key has queued or running, as a sorted set of job ids. The producer adds a job at
    admission and removes it when it cancels one; whoever ends a job removes it beside the
    ending script (ZREM of the job id from the set the job hash names in its `inflight` field;
    ZREM is idempotent, so every terminal path may). A job whose removal was lost, or that is
    queued past its deadline (no worker reads its partition to expire it), is pruned when the
    set reaches its cap, so the cap is never exceeded and such a job costs a slot only until
    the next refusal."""

    SCAN = 64
    GRACE_MS = 10_000

    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_ms = ttl_s * 1000
        self._admit = client.register_script(IN_FLIGHT)
        self._release = client.register_script(RELEASE)

    async def admit(self, key_id: str, job_id: str, cap: int) -> bool:
        """Take a slot for the job; at the cap, prune the members whose jobs ended and try
        once more."""
        keys = [self.keys.in_flight(key_id), self.keys.in_flight_scan(key_id)]
        admitted, now_ms, rows = await call_script(
            self._admit, keys, [cap, job_id, self.ttl_ms, self.SCAN]
        )
        if admitted:
            return True
        if not await self._prune(keys[0], int(now_ms), rows):
            return False
        admitted, _, _ = await call_script(self._admit, keys, [cap, job_id, self.ttl_ms, 0])
        return bool(admitted)

    async def _prune(self, in_flight: str, now_ms: int, rows: list[Any]) -> bool:
        """Remove the members whose job is terminal, queued past its deadline, or has no hash
        `GRACE_MS` after its admission (a submit that died); whether there were any. One
        pipeline reads their statuses and deadlines: each job hash is in its partition's slot,
        which a cluster pipeline reaches node by node."""
        members = [(as_text(jid), float(ms)) for jid, ms in zip(rows[::2], rows[1::2], strict=True)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id, _ in members:
                pipe.hmget(self.keys.job(job_id), "status", "deadline")
            found = await pipe.execute()
        ended = [
            job_id
            for (job_id, admitted_ms), (status, deadline) in zip(members, found, strict=True)
            if not self._live(status, deadline, now_ms, admitted_ms)
        ]
        if not ended:
            return False
        # Their slots are free now, whatever RELEASE counts: its rerun after a lost reply (the
        # client resends scripts) found them gone and counted none, and the submit got a 429.
        await call_script(self._release, [in_flight], ended)
        return True

    def _live(
        self, status: bytes | None, deadline: bytes | None, now_ms: int, admitted_ms: float
    ) -> bool:
        """Queued or running; without a hash, only while its submit may still be writing it:
        admitted within `GRACE_MS` of now, either side (one admitted further ahead was stamped
        by a clock Redis's stepped back from, a failover's, whose submit likely died with it:
        its slot was held until the clock caught up). A job queued `GRACE_MS` past its deadline
        (the producer's clock, not Redis's) can only expire: it held its slot until a worker
        read it, so jobs waiting on a partition no worker serves kept the key from submitting
        to any other model."""
        if status is None:
            return abs(now_ms - admitted_ms) < self.GRACE_MS
        deadline_ms = int(deadline or 0)  # 0: none
        if as_text(status) == JobStatus.QUEUED and deadline_ms:
            return now_ms < deadline_ms + self.GRACE_MS
        return as_text(status) in _LIVE

    async def release(self, key_id: str, job_id: str) -> None:
        """Give the job's slot back (its submit enqueued nothing)."""
        await call_script(self._release, [self.keys.in_flight(key_id)], [job_id])


class StreamLimiter:
    """Job-event streams a key holds open, as a sorted set of stream ids by when each was last
    seen alive (Redis's clock). A stream takes its place when it opens, renews it while it
    lasts and gives it back when it ends; the place of one whose producer died first lapses
    `lapse_s` after its last renewal, so a lost removal costs a place only that long."""

    def __init__(self, client: aioredis.Redis, keys: Keys, lapse_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.lapse_ms = math.ceil(lapse_s * 1000)
        self._hold = client.register_script(HOLD_STREAM)

    async def hold(self, key_id: str, stream_id: str, cap: int) -> bool:
        """Take or renew the stream's place; False when the key holds `cap` others."""
        keys = [self.keys.open_streams(key_id)]
        return bool(await call_script(self._hold, keys, [cap, stream_id, self.lapse_ms]))

    async def release(self, key_id: str, stream_id: str) -> None:
        await self.redis.zrem(self.keys.open_streams(key_id), stream_id)


def queue_slot_frees(pipe: Any, held: Sequence[tuple[str, str]]) -> None:
    """Queue on `pipe` the release of each ended job's in-flight slot: (the set its entry or
    hash names, job id), '' for a job that held none."""
    by_set: dict[str, list[str]] = {}
    for slot, job_id in held:
        if slot:
            by_set.setdefault(slot, []).append(job_id)
    for slot, job_ids in by_set.items():
        pipe.zrem(slot, *job_ids)


async def hold_slots_again(
    client: Any, held: Sequence[tuple[str, str]], ttl_s: int, now_ms: int
) -> None:
    """Take back, in one round trip, the in-flight slots `queue_slot_frees` gave up beside a
    write-back for jobs that still run (their results refused: another worker took them over).
    ZADD NX at now: a job its new owner finished meanwhile holds its slot only until the
    limiter's prune at the cap finds it ended; the set's TTL is set only where it has none (the
    free may have emptied and so deleted it)."""
    async with client.pipeline(transaction=False) as pipe:
        for slot, job_id in held:
            if slot:
                pipe.zadd(slot, {job_id: now_ms}, nx=True)
                pipe.pexpire(slot, ttl_s * 1000, nx=True)
        await pipe.execute()
