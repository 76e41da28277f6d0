"""Admission for new jobs: idempotency keys (a retried submit returns the original job) and
backpressure (a full partition answers 429 with a Retry-After from its recent drain rate)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from producer_api.errors import ConveyorError
from producer_api.task_cancel import cancel_and_wait
from shared.codec import as_text, dumps
from shared.drain_rate import drain_rates
from shared.keys import Keys
from shared.redis_client import call_script

log = logging.getLogger(__name__)

DRAIN_WINDOW_S = 10
# How long a repeated submit waits for the first one with its key to be enqueued (or to give the
# key up), and how often it looks: enqueuing takes milliseconds.
IN_PROGRESS_WAIT_S = 5.0
IN_PROGRESS_POLL_S = 0.05
# A claim whose job never appeared this long after it was made (or last renewed, `kept`) was
# abandoned: its submit failed and could not give the key back (Redis went away), or its
# producer died. Far longer than an enqueue can take.
ABANDONED_AFTER_S = 60.0
# How many times per ABANDONED_AFTER_S a claim `kept` is renewed: a renewal late by up to
# three quarters of it (a busy event loop, a slow Redis) still keeps the claim.
RENEWALS = 4
# Give a key up only if this submit's claim (its job id) still holds it: another's (a retry
# that took it over) stays.
RELEASE_OWN = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# A claim's time is Redis's (Unix ms), never a producer's: a producer whose clock was a minute
# behind wrote claims that others took over as abandoned while they were live, and one whose
# clock was ahead never took an abandoned one over.
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(t[2] / 1000))
end
"""
# Claim a key (`{job_id}:{fingerprint}`, its time appended) unless one holds it; either way
# the claim it holds and Redis's time, which the claim's age is judged by (`Claim.abandoned`).
# One call, as the SET NX it replaces: a taken key's claim comes back with it.
CLAIM = (
    _NOW_MS
    + """
local now = now_ms()
local held = redis.call('GET', KEYS[1])
if held then return {held, now} end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. now, 'EX', ARGV[2])
return {'', now}
"""
)
# Take an abandoned claim (as read, `Claim.held`) over, unless another submit changed or its
# own create renewed it meanwhile; with a job id and `:`, renew one's own (`kept`). One that
# holds this submit's claim already is this call's own, rerun after its reply was lost.
TAKE_OVER = (
    _NOW_MS
    + """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2] .. ':' .. now_ms(), 'EX', ARGV[3])
  return 1
end
if held and string.sub(held, 1, #ARGV[2] + 1) == ARGV[2] .. ':' then return 1 end
return 0
"""
)
SCRIPTS = (RELEASE_OWN, CLAIM, TAKE_OVER)


@dataclass(frozen=True, slots=True)
class BodyPrint:
    """A body's identity for an idempotent retry: the SHA-256 of its JSON with keys sorted, since
    a client may send the same object's keys in another order (JSON objects have none), and of
    its JSON as sent, what producers before that stored: a claim lives `claim_ttl_s`, and a retry
    that a rolling upgrade sent to a newer producer is still the same request."""

    value: str
    as_sent: str = ""

    @classmethod
    def of(cls, body: dict[str, object]) -> BodyPrint:
        canonical = orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS)
        as_sent = hashlib.sha256(dumps(body)).hexdigest()
        return cls(hashlib.sha256(canonical).hexdigest(), as_sent)

    def matches(self, stored: str) -> bool:
        return stored in (self.value, self.as_sent)


@dataclass(frozen=True, slots=True)
class Claim:
    """What a key's claim holds: the job it was made for, the body's fingerprint, and when (Unix
    ms on Redis's clock; a producer's in a claim an older release wrote, 0 in one written before
    claims carried it); read back, Redis's time then (`read_ms`)."""

    job_id: str
    fingerprint: str
    made_ms: int
    read_ms: int = 0

    @classmethod
    def new(cls, job_id: str, fingerprint: str) -> Claim:
        """The claim a submit makes: Redis stamps its time as it writes it (`CLAIM`)."""
        return cls(job_id, fingerprint, 0)

    @classmethod
    def parse(cls, value: bytes | str, read_ms: int = 0) -> Claim:
        job_id, _, rest = as_text(value).partition(":")
        fingerprint, _, made_ms = rest.partition(":")
        return cls(job_id, fingerprint, int(made_ms or 0), read_ms)

    def value(self) -> str:
        return f"{self.job_id}:{self.fingerprint}:{self.made_ms}"

    def stem(self) -> str:
        """What the scripts write before the time they append."""
        return f"{self.job_id}:{self.fingerprint}"

    def abandoned(self) -> bool:
        """Made (or last renewed) over ABANDONED_AFTER_S before it was read, both on Redis's
        clock: no producer's clock, skewed, judges another's claim."""
        return self.read_ms - self.made_ms > ABANDONED_AFTER_S * 1000

    def held(self) -> str:
        """What a take-over finds the key holding to replace it: this claim whole, as read, so
        one renewed since (`IdempotencyKeys.kept`) stays; one from before claims carried their
        time (never renewed) by its job id."""
        return self.value() if self.made_ms else f"{self.job_id}:"


@dataclass(slots=True)
class Hold:
    """A claim `IdempotencyKeys.kept` keeps: when a renewal last found it this request's
    (monotonic s), and whether one found another's in its place."""

    confirmed: float
    lost: bool = False


def claim_ttl_s(result_ttl_s: int) -> int:
    """How long a key's claim lives: as long as the record of what it names may. A job's record
    lives a result TTL from its submit, or from its end once it ends (so two at most: unended
    a result TTL after its submit, it is gone); a batch's, its window (a result TTL at most) and
    a result TTL. With one result TTL a retry made a second job, running the same work again,
    while the first one's record still lived. A claim outliving its job is taken over (`claim`)."""
    return 2 * result_ttl_s


class IdempotencyKeys:
    """`cv:idem:{tenant}:{sha256(key)}` → `{job_id}:{body fingerprint}:{claimed ms}`, SET NX
    with `claim_ttl_s`; hashing the header keeps client text out of key names."""

    def __init__(self, client: aioredis.Redis, keys: Keys, result_ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = claim_ttl_s(result_ttl_s)
        self._release = client.register_script(RELEASE_OWN)
        self._claim_key = client.register_script(CLAIM)
        self._take_over = client.register_script(TAKE_OVER)

    def _key(self, tenant: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return self.keys.idempotency(tenant, digest)

    async def claim(
        self,
        tenant: str,
        key: str,
        job_id: str,
        body_print: BodyPrint,
        enqueued: Callable[[str], Awaitable[bool]],
    ) -> str | None:
        """None if this submit owns the key now; else the id of the job it was first used for,
        once `enqueued` says that job is. A client's retry can arrive while its first try is still
        being enqueued (the client timed out): answering with the job id then would hand over an
        id that never exists should the first try fail (a full queue). So the retry waits for
        the job, or for the first try to give the key up, and then enqueues its own. A claim
        whose job never appeared within `ABANDONED_AFTER_S` is taken over: its submit could not
        give it back, and would otherwise answer every retry 409 until the key expired; so is
        one whose job has expired since (the claim outlives it), whatever the body: the key is
        free once what it named is gone."""
        mine = Claim.new(job_id, body_print.value)
        deadline = time.monotonic() + IN_PROGRESS_WAIT_S
        while (first := await self._claim(tenant, key, mine)) is not None:
            if await enqueued(first.job_id):
                if not body_print.matches(first.fingerprint):
                    raise _other_body()
                return first.job_id
            if first.abandoned() and await self._taken_over(tenant, key, first, mine):
                return None
            if not body_print.matches(first.fingerprint):
                raise _other_body()
            if time.monotonic() >= deadline:
                raise ConveyorError(
                    409,
                    "conflict",
                    "the first request with this Idempotency-Key is still being enqueued; retry",
                    {"Retry-After": "1"},
                )
            await asyncio.sleep(IN_PROGRESS_POLL_S)
        return None

    async def _claim(self, tenant: str, key: str, mine: Claim) -> Claim | None:
        """None if this submit owns the key now; else the claim it was first used with."""
        args = [mine.stem(), self.ttl_s]
        held, now = await call_script(self._claim_key, [self._key(tenant, key)], args)
        if not held:
            return None
        first = Claim.parse(held, int(now))
        if first.job_id == mine.job_id:  # this claim, rerun after its reply was lost, found itself
            return None
        return first

    async def _taken_over(self, tenant: str, key: str, held: Claim, mine: Claim) -> bool:
        """Whether `mine` holds the key now, in place of `held` as it was read: False once
        another's claim holds it, or `held` renewed since."""
        return await self._replaced(tenant, key, held.held(), mine)

    async def _replaced(self, tenant: str, key: str, held: str, mine: Claim) -> bool:
        """Whether `mine` holds the key now, in place of the claim that starts with `held`."""
        args = [held, mine.stem(), self.ttl_s]
        return bool(await call_script(self._take_over, [self._key(tenant, key)], args))

    @asynccontextmanager
    async def kept(
        self, tenant: str, key: str, job_id: str, body_print: BodyPrint
    ) -> AsyncIterator[Hold]:
        """Keep the claim made for `job_id` young while what it names is being made: a batch's
        create enqueues up to `CONVEYOR_MAX_BATCH_LINES` lines, which a slow Redis can stretch
        past ABANDONED_AFTER_S, and a retry took that claim over as abandoned and created the
        batch a second time. Renewed RENEWALS times per ABANDONED_AFTER_S, so the claim of a
        producer that died still ages out; no Redis call for work done sooner. The `Hold` says
        whether the claim was lost to a take-over all the same (its producer stalled past
        ABANDONED_AFTER_S): then what was made is a second one, for its maker to withdraw. A
        renewal overdue at the end (the stall came last) is made then, to tell."""
        mine, hold = Claim.new(job_id, body_print.value), Hold(time.monotonic())
        renewing = asyncio.create_task(self._renew(tenant, key, mine, hold))
        try:
            yield hold
        finally:
            await cancel_and_wait(renewing)
        if not hold.lost and time.monotonic() - hold.confirmed > ABANDONED_AFTER_S / 2:
            await self._renewed(tenant, key, mine, hold)

    async def _renew(self, tenant: str, key: str, mine: Claim, hold: Hold) -> None:
        while True:
            await asyncio.sleep(ABANDONED_AFTER_S / RENEWALS)
            if not await self._renewed(tenant, key, mine, hold):
                return  # taken over: another's to keep now

    async def _renewed(self, tenant: str, key: str, mine: Claim, hold: Hold) -> bool:
        """Renew `mine`: False once another request's claim holds the key (`hold.lost`). One
        that Redis refused tells nothing: the next may get through."""
        sent = time.monotonic()
        try:
            hold.lost = not await self._replaced(tenant, key, f"{mine.job_id}:", mine)
        except RedisError as exc:
            log.warning("could not renew an idempotency key: %r", exc)
            return True
        hold.confirmed = sent
        return not hold.lost

    async def used_for(
        self,
        tenant: str,
        key: str,
        body_print: BodyPrint,
        enqueued: Callable[[str], Awaitable[bool]],
    ) -> str | None:
        """The job a request with this key and body was accepted as, if one was (read only:
        for a retry that would be refused now)."""
        existing = await self.redis.get(self._key(tenant, key))
        if existing is None:
            return None
        first = Claim.parse(existing)
        if not body_print.matches(first.fingerprint) or not await enqueued(first.job_id):
            return None
        return first.job_id

    async def release(self, tenant: str, key: str, job_id: str) -> None:
        """Free the key when the submit that claimed it for `job_id` did not enqueue anything
        (a claim that failed may have been written all the same). Best effort: a key that
        cannot be given back now is taken over once abandoned (`claim`)."""
        try:
            await call_script(self._release, [self._key(tenant, key)], [f"{job_id}:"])
        except RedisError as exc:
            log.warning("could not give back an idempotency key: %r", exc)


def _other_body() -> ConveyorError:
    return ConveyorError(409, "conflict", "Idempotency-Key was already used with a different body")


class Backpressure:
    """What a full partition answers, from the per-second drain counters workers keep."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    async def queue_full(self, stream: str, length: int, room: int = 1) -> ConveyorError:
        """429 whose Retry-After is how long the partition needs, at its drain rate over the
        last few seconds, to make room for `room` more entries (a batch's: the time for one
        sent its clients back in a second, and their retries ran out while the lane drained),
        1 s at least, 60 s at most (OpenAI's SDKs ignore a longer one)."""
        (rate,) = await drain_rates(self.redis, self.keys, [stream], DRAIN_WINDOW_S)
        wait = 60 if rate == 0 else min(60, max(1, math.ceil(room / rate)))
        return ConveyorError(
            429,
            "queue_full",
            f"{stream} is full ({length} queued or in flight); retry in {wait}s",
            {"Retry-After": str(wait)},
        )
