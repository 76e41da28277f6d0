"""API keys: who may call the producer, as which tenant, with which scopes and limits.

A key is shown once, at creation, and stored only as its SHA-256 (`cv:apikey:{key_id}`, where
`key_id` is the first 16 hex digits of that digest): keys are 256-bit random tokens, so a fast
hash is enough (a slow password hash protects low-entropy secrets), and a leaked Redis dump
yields no usable key. Lookup goes by `key_id`, then the full digest is compared in constant
time. Revocation and expiry take effect on the next request, on every producer replica.

Every key time (`created_at`, `revoked_at`, an expiry and the moment it is judged against) is on
Redis's clock (`shared/redis_clock.py`), as a job's are: on each host's own, two producers a
minute apart let a key live a minute longer on one, and `conveyor keys` wrote an operator's
laptop's time as the key's."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, cast

import redis.asyncio as aioredis

from shared.api_key_scopes import SCOPES
from shared.codec import as_text
from shared.keys import Keys
from shared.redis_client import (
    check_replica_acks,
    hgetall_many,
    queue_replica_wait,
    queue_script,
    run_pipeline,
)
from shared.redis_clock import CLOCK
from shared.settings import MAX_BURST, MIN_RATE_PER_S, VISIBLE_ASCII

log = logging.getLogger(__name__)

TENANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
KEY_ID = re.compile(r"^[0-9a-f]{16}$")
# What a presented key may look like before anything is hashed or looked up.
PRESENTED = re.compile(f"^{VISIBLE_ASCII}{{8,256}}$")
KEY_PREFIX = "cvk_"
# A tenant's fair-queuing weight lies in [MIN_WEIGHT, MAX_WEIGHT]: fair queuing's scripts spend
# a smaller one as MIN_WEIGHT (its turns to a whole credit, 1 / weight, overflowed to infinity).
MIN_WEIGHT, MAX_WEIGHT = 1e-9, 1000.0


class InvalidKeySpec(ValueError):
    """A key that cannot be created as asked (bad tenant, scope or model name)."""


class CorruptKeyRecord(ValueError):
    """A stored key record that does not parse (a field missing or not a number)."""


class KeyNotRotatable(ValueError):
    """A rotation refused: the old key is unknown, revoked or expired (said by the message)."""


# Stores a key's record and its id in the index; for a rotation (KEYS[3], the old key's record)
# only while the old key is usable, checked in the same atomic step: a revoke read before the
# write let a replacement of a revoked key through. ARGV: now, the new key's id, the old key's
# expiry from now on ("": unchanged; only ever brought closer), the record's field/value pairs.
# The first cut keeps the old key's own expiry (`own_expires_at`, ApiKey.lifetime_s): a second
# rotation of it (a rerun of one its replicas did not confirm) took the grace for its lifetime,
# and its new key, of a key that never expired, stopped with the old one.
# Replies "ok", or why the old key may not be rotated (ApiKey.refusal's words).
STORE_KEY = """
if #KEYS == 3 then
  local old = redis.call('HMGET', KEYS[3], 'digest', 'revoked_at', 'expires_at')
  if not old[1] then return 'unknown API key' end
  if tonumber(old[2] or '0') ~= 0 then return 'API key revoked' end
  local expires = tonumber(old[3] or '0') or 0
  if expires > 0 and tonumber(ARGV[1]) >= expires then return 'API key expired' end
  local cutoff = tonumber(ARGV[3])
  if cutoff and (expires == 0 or cutoff < expires) then
    redis.call('HSETNX', KEYS[3], 'own_expires_at', old[3] or '0')
    redis.call('HSET', KEYS[3], 'expires_at', ARGV[3])
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('SADD', KEYS[2], ARGV[2])
return 'ok'
"""


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(key: str) -> str:
    """A key's public id: a prefix of its digest, so any key string (a chosen dev key too) has
    one, and the id reveals nothing of the key."""
    return digest_of(key)[:16]


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What a key allows: its tenant, scopes, models (empty: every model), expiry (0: never),
    limits (None: the producer's defaults from settings) and its tenant's weight in fair
    queuing (a fair lane serves tenants in proportion to it)."""

    tenant: str
    scopes: frozenset[str]
    models: frozenset[str] = frozenset()
    name: str = ""
    expires_at: float = 0.0
    rate_per_s: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    max_streams: int | None = None
    weight: float = 1.0

    def check(self) -> None:
        """Tenants and model names end up in Redis key names: only validated identifiers."""
        if not TENANT.fullmatch(self.tenant):
            raise InvalidKeySpec(f"tenant {self.tenant!r} must match {TENANT.pattern}")
        if unknown := set(self.scopes) - set(SCOPES):
            raise InvalidKeySpec(f"unknown scopes {sorted(unknown)}; choose from {list(SCOPES)}")
        if not self.scopes:
            raise InvalidKeySpec("a key needs at least one scope")
        if bad := sorted(m for m in self.models if not TENANT.fullmatch(m)):
            raise InvalidKeySpec(f"invalid model names {bad}")
        # `keys list` prints one tab-separated line a key: a tab or a newline in a name made
        # extra columns, or a line that reads as another key
        if not self.name.isprintable():
            raise InvalidKeySpec(f"name {self.name!r} must be printable: no tabs or line breaks")
        if not (math.isfinite(self.weight) and MIN_WEIGHT <= self.weight <= MAX_WEIGHT):
            bounds = f"[{MIN_WEIGHT:g}, {MAX_WEIGHT:g}]"
            raise InvalidKeySpec(f"weight {self.weight} must be a number in {bounds}")
        self._check_limits()

    def _check_limits(self) -> None:
        """A limit is unset (the producer's default) or positive: a negative rate would make the
        token bucket's expiry negative (no limit at all), a burst or cap below 1 refuse every
        request, and 0 would quietly mean the default. A rate below MIN_RATE_PER_S made every
        request of the key a 500 (the bucket's expiry past what Redis takes), a burst above
        MAX_BURST a bucket that never emptied (a token lost in a double's rounding)."""
        rate = self.rate_per_s
        if rate is not None and not (math.isfinite(rate) and rate >= MIN_RATE_PER_S):
            raise InvalidKeySpec(
                f"rate {rate} must be a positive number of requests per second, at least"
                f" {MIN_RATE_PER_S:g}"
            )
        if self.burst is not None and self.burst > MAX_BURST:
            raise InvalidKeySpec(f"burst {self.burst} must be at most {MAX_BURST:,}")
        limits = (
            ("burst", self.burst),
            ("max in flight", self.max_in_flight),
            ("max streams", self.max_streams),
        )
        for name, limit in limits:
            if limit is not None and limit < 1:
                raise InvalidKeySpec(f"{name} {limit} must be at least 1")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key: its public id, the digest of the secret, and what it allows."""

    key_id: str
    digest: str
    spec: KeySpec
    created_at: float = 0.0
    revoked_at: float = 0.0
    # the key whose limits this one shares (a rotation's new key, so a tenant rotating a key
    # does not double its capacity while both keys work); empty: its own
    limits_of: str = ""
    # the expiry it was made with (0: never), kept once a rotation's grace brought
    # `spec.expires_at` closer (STORE_KEY); None: never cut
    own_expires_at: float | None = None

    @property
    def limits_id(self) -> str:
        """The id that names this key's rate bucket, in-flight set and open-streams set."""
        return self.limits_of or self.key_id

    @property
    def lifetime_s(self) -> float:
        """How long it was made to live (0: for ever), what its rotation gives the new key by
        default: not shortened by a grace period a rotation gave it."""
        own = self.spec.expires_at if self.own_expires_at is None else self.own_expires_at
        return own - self.created_at if own else 0.0

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(self.digest, digest_of(key))

    def refusal(self, now: float) -> str | None:
        """Why this key may not be used now (revoked, expired), or None."""
        if self.revoked_at:
            return "API key revoked"
        if self.spec.expires_at and now >= self.spec.expires_at:
            return "API key expired"
        return None

    def to_fields(self) -> dict[str | bytes, str]:
        out: dict[str | bytes, str] = {
            "key_id": self.key_id,
            "digest": self.digest,
            "created_at": str(self.created_at),
        }
        if self.limits_of:
            out["limits_of"] = self.limits_of
        if self.own_expires_at is not None:
            out["own_expires_at"] = str(self.own_expires_at)
        for f in fields(self.spec):
            value = getattr(self.spec, f.name)
            if value is not None:
                out[f.name] = (
                    ",".join(sorted(value)) if isinstance(value, frozenset) else str(value)
                )
        return out

    @classmethod
    def from_fields(cls, raw: Mapping[bytes | str, bytes | str]) -> ApiKey:
        """The record stored as `raw`; CorruptKeyRecord when it does not parse."""
        text = {as_text(k): as_text(v) for k, v in raw.items()}
        try:
            return cls._parsed(text)
        except (KeyError, ValueError) as exc:
            raise CorruptKeyRecord(f"key {text.get('key_id', '?')}: {exc!r}") from None

    @classmethod
    def _parsed(cls, text: Mapping[str, str]) -> ApiKey:
        """`from_fields` of decoded fields; KeyError or ValueError on a bad record."""

        def number(name: str, kind: Callable[[str], float | int]) -> float | int | None:
            value = text.get(name)
            return kind(value) if value else None

        spec = KeySpec(
            tenant=text["tenant"],
            scopes=_split(text.get("scopes", "")),
            models=_split(text.get("models", "")),
            name=text.get("name", ""),
            expires_at=_finite(text.get("expires_at") or "0"),
            rate_per_s=cast(float | None, number("rate_per_s", _finite)),
            burst=cast(int | None, number("burst", int)),
            max_in_flight=cast(int | None, number("max_in_flight", int)),
            max_streams=cast(int | None, number("max_streams", int)),
            weight=_finite(text.get("weight") or "1.0"),
        )
        return cls(
            key_id=text["key_id"],
            digest=text["digest"],
            spec=spec,
            created_at=_finite(text.get("created_at") or "0"),
            revoked_at=_finite(text.get("revoked_at") or "0"),
            limits_of=text.get("limits_of", ""),
            own_expires_at=cast(float | None, number("own_expires_at", _finite)),
        )


def _finite(value: str) -> float:
    """A stored number; ValueError for NaN or infinity (a hand edit), which `float` takes: a NaN
    expiry never came (no comparison holds) and `keys list` could print neither."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _split(value: str) -> frozenset[str]:
    return frozenset(part for part in value.split(",") if part)


def _issued(spec: KeySpec, secret: str | None, limits_of: str) -> tuple[str, ApiKey]:
    """A new key (`secret`, else a random one) and its record, both checked; nothing stored."""
    spec.check()
    key = secret or new_key()
    # whole: `$` matched before a final newline, and a chosen key stored with one (a file
    # or Secret written by `echo`) was a key no client can send in a header
    if not PRESENTED.fullmatch(key):
        raise InvalidKeySpec("a key is 8 to 256 printable ASCII characters, no spaces")
    record = ApiKey(
        key_id_of(key), digest_of(key), spec, created_at=CLOCK.now(), limits_of=limits_of
    )
    return key, record


def _parsed_or_none(raw: Mapping[bytes | str, bytes | str]) -> ApiKey | None:
    """The record stored as `raw`, None when there is none or it is corrupt (logged)."""
    if not raw:
        return None
    try:
        return ApiKey.from_fields(raw)
    except CorruptKeyRecord as exc:
        log.error("unusable API key record, refused: %s", exc)
        return None


class ApiKeyStore:
    """Create, verify, list and revoke keys; the producer and `conveyor keys` share it."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._store = client.register_script(STORE_KEY)

    async def create(
        self, spec: KeySpec, secret: str | None = None, limits_of: str = ""
    ) -> tuple[str, ApiKey]:
        """Store a new key and return it in plain text, the only time it exists outside the
        caller's hands. A given `secret` (the development key) is stored the same way; storing
        it again replaces its record. `limits_of` names the key whose limits it shares."""
        key, record = _issued(spec, secret, limits_of)
        await self._write(record)
        return key, record

    async def rotate(
        self, old: ApiKey, expires_at: float, old_expires_at: float = 0.0
    ) -> tuple[str, ApiKey]:
        """A new key with `old`'s spec (expiring at `expires_at`, 0: never) that shares its
        limits, as OpenAI's and Stripe's rotations do: with limits of its own, a tenant had
        twice its capacity while both keys worked. Links go to the first key of a chain, so
        every key of it shares one set. `old` works on until revoked or expired, or until
        `old_expires_at` (0: unchanged) where that is sooner: a grace period to roll clients
        over. KeyNotRotatable, with nothing written, when `old` is no longer usable."""
        spec = replace(old.spec, expires_at=expires_at)
        key, record = _issued(spec, None, old.limits_id)
        await self._write(record, old.key_id, old_expires_at)
        return key, record

    async def _write(self, record: ApiKey, old_id: str = "", old_expires_at: float = 0.0) -> None:
        """Store `record` (a rotation of `old_id`'s key: only while that key is usable),
        confirmed by CONVEYOR_REPLICA_ACKS replicas as a revocation is (else ReplicaAckTimeout):
        a key shown once and lost to a failover is refused to the client that stored it, and a
        grace period lost brings back the old key it ended."""
        names = [self.keys.api_key(record.key_id), self.keys.api_key_index]
        if old_id:
            names.append(self.keys.api_key(old_id))
        flat = [part for pair in record.to_fields().items() for part in pair]
        cutoff = str(old_expires_at) if old_expires_at else ""
        args = [str(CLOCK.now()), record.key_id, cutoff, *flat]

        async def fill(pipe: Any) -> int:
            queue_script(pipe, self._store, names, args)
            return await queue_replica_wait(self.redis, pipe, names)

        _, replies = await run_pipeline(self.redis, fill, [self._store])
        if (outcome := as_text(replies[0])) != "ok":
            raise KeyNotRotatable(outcome)
        check_replica_acks(replies[1:])

    async def verify(self, presented: str) -> ApiKey | None:
        """The record of a presented key, or None when no stored key matches it."""
        if not PRESENTED.fullmatch(presented):
            return None
        record = await self.get(key_id_of(presented))
        if record is None or not record.matches(presented):
            return None
        return record

    async def get(self, key_id: str) -> ApiKey | None:
        """The key's record; None when there is none, or it is corrupt: such a key is refused
        as unknown (it was a 500 on every request that presented it, and ended its streams with
        a traceback), and `revoke` still takes it."""
        if not KEY_ID.fullmatch(key_id):
            return None
        return _parsed_or_none(await self.redis.hgetall(self.keys.api_key(key_id)))

    async def usable(self, key_id: str) -> ApiKey | None:
        """The key, unless it is unknown, revoked or expired: what a session or a stream opened
        under it looks at again while it lasts."""
        key = await self.get(key_id)
        return key if key is not None and key.refusal(CLOCK.now()) is None else None

    async def list(self) -> list[ApiKey]:
        """Every key, its records read in one pipelined round trip (not one per key)."""
        ids = sorted(as_text(i) for i in await self.redis.smembers(self.keys.api_key_index))
        raws = await hgetall_many(self.redis, [self.keys.api_key(key_id) for key_id in ids])
        return [record for raw in raws if (record := _parsed_or_none(raw)) is not None]

    async def revoke(self, key_id: str) -> bool:
        """Mark a key revoked (kept for `list`); False if there is no such key. Confirmed by
        CONVEYOR_REPLICA_ACKS replicas as a job's 202 is, else ReplicaAckTimeout: written on
        the primary alone, a failover could bring a leaked key back."""
        name = self.keys.api_key(key_id)
        # EXISTS, not a parse of the record: a corrupt one is revoked as any other
        if not KEY_ID.fullmatch(key_id) or not await self.redis.exists(name):
            return False
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(name, "revoked_at", str(CLOCK.now()))
            await queue_replica_wait(self.redis, pipe, [name])
            replies = await pipe.execute()
        check_replica_acks(replies[1:])
        return True
