"""Per-key quotas shared by every producer replica: a token bucket (requests per second with a
burst) and a cap on jobs in flight. Each decision is one Lua script on Redis's clock, so two
replicas racing for the last token cannot both win and skewed host clocks do not matter."""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared.job_states import TERMINAL, JobStatus
from shared.keys import Keys

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1]=bucket; ARGV: rate per second, burst, cost. Returns
# {allowed (0|1), tokens left (floored), ms until one more token, ms until the bucket is full}.
TOKEN_BUCKET = (
    _NOW_MS
    + """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate / 1000) end
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', math.max(now, ts))
local full_ms = math.ceil((burst - tokens) * 1000 / rate)
redis.call('PEXPIRE', KEYS[1], full_ms + 1000)
local next_ms = 0
if tokens < cost then next_ms = math.ceil((cost - tokens) * 1000 / rate) end
return {allowed, math.floor(tokens), next_ms, full_ms}
"""
)

_LIVE = ", ".join(f"{s.value}=1" for s in JobStatus if s not in TERMINAL)

# KEYS[1]=in-flight set, KEYS[2]=rescan marker; ARGV: cap, job id, job-key prefix, scan, grace
# ms, ttl ms. Below the cap a job is added at once. At the cap, members whose job is terminal
# (or never appeared within `grace`: a submit that died) are pruned first: the oldest `scan`
# always, the whole set at most once a second. Returns {admitted (0|1), members after}.
IN_FLIGHT = (
    _NOW_MS
    + "local LIVE = {"
    + _LIVE
    + "}\n"
    + """
local cap, jid, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local scan, grace = tonumber(ARGV[4]), tonumber(ARGV[5])
local function prune(last)
  local rows = redis.call('ZRANGE', KEYS[1], 0, last, 'WITHSCORES')
  for i = 1, #rows, 2 do
    local status = redis.call('HGET', prefix .. rows[i], 'status')
    local live = status and LIVE[status] or (not status and now - tonumber(rows[i + 1]) < grace)
    if not live then redis.call('ZREM', KEYS[1], rows[i]) end
  end
end
if redis.call('ZCARD', KEYS[1]) >= cap then
  local last = scan - 1
  if redis.call('SET', KEYS[2], 1, 'NX', 'PX', 1000) then last = -1 end
  prune(last)
end
local count = redis.call('ZCARD', KEYS[1])
if count >= cap then return {0, count} end
redis.call('ZADD', KEYS[1], now, jid)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, count + 1}
"""
)


@dataclass(frozen=True, slots=True)
class Quota:
    """One key's limits: `rate_per_s` with bursts of `burst`, at most `max_in_flight` jobs."""

    rate_per_s: float
    burst: int
    max_in_flight: int


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
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.keys = keys
        self._bucket = client.register_script(TOKEN_BUCKET)

    async def take(self, key_id: str, quota: Quota) -> BucketState:
        """Take one token from the key's bucket; `allowed` is False when it is empty."""
        allowed, remaining, next_ms, full_ms = await self._bucket(
            keys=[self.keys.rate_bucket(key_id)], args=[quota.rate_per_s, quota.burst, 1]
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
    admission and removes it when it cancels one. Jobs that end on a worker are pruned when
    the set reaches its cap, so the cap is never exceeded and needs no worker change; a
    write-back script may also free the slot at once (ZREM of the job id from the set the job
    hash names in its `inflight` field; ZREM is idempotent, so every terminal path may)."""

    SCAN = 64
    GRACE_MS = 10_000

    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_ms = ttl_s * 1000
        self._admit = client.register_script(IN_FLIGHT)

    async def admit(self, key_id: str, job_id: str, cap: int) -> bool:
        prefix = self.keys.job_prefix
        args: list[str | int] = [cap, job_id, prefix, self.SCAN, self.GRACE_MS, self.ttl_ms]
        admitted, _ = await self._admit(
            keys=[self.keys.in_flight(key_id), self.keys.in_flight_scan(key_id)], args=args
        )
        return bool(admitted)

    async def release(self, key_id: str, job_id: str) -> None:
        await self.redis.zrem(self.keys.in_flight(key_id), job_id)
