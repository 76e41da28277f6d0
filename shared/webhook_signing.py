"""HMAC-SHA256 signatures of webhook deliveries, over `timestamp.body` like Stripe's: the
timestamp inside the signed text lets a receiver refuse replays of an old, captured delivery.

Header: `Conveyor-Signature: t=<unix seconds>,v1=<hex digest>`. Receivers call `verify`.

Each event is signed with its owner's key (`owner_secret`), derived from the operator's
CONVEYOR_WEBHOOK_SECRET: a receiver holds its own tenant's key only, so it can neither forge
another tenant's events nor take another tenant's job (pointed at its URL) for one of its own."""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Conveyor-Signature"
DEFAULT_TOLERANCE_S = 300.0
# What `owner_secret` signs before the owner's name: fixed, so the operator can derive a key by
# hand; versioned, so another derivation could never yield the same keys.
OWNER_LABEL = "conveyor-webhook-owner-v1:"
# The owner of the operator's own events (canaries): no tenant can be named so
# (shared/api_keys.TENANT starts with a lowercase letter or a digit).
OPERATOR = "~operator"


class InvalidSignature(ValueError):
    """The header is malformed, the digest does not match, or the timestamp is stale."""


def owner_secret(secret: str, owner: str) -> str:
    """The key that signs the events of `owner` (a tenant, or `OPERATOR`): hex HMAC-SHA256 of
    the operator's `secret` over `OWNER_LABEL` and the owner's name."""
    return hmac.new(secret.encode(), (OWNER_LABEL + owner).encode(), hashlib.sha256).hexdigest()


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None, previous: str = "") -> str:
    """The header value for `body`, signed now (or at `timestamp`); with a `previous` key too,
    during a rotation (one `v1` each, as Stripe's header carries: `verify` takes either)."""
    stamp = int(time.time()) if timestamp is None else timestamp
    keys = (secret, previous) if previous and previous != secret else (secret,)
    return f"t={stamp}," + ",".join(f"v1={_digest(key, stamp, body)}" for key in keys)


def _parse(header: str) -> tuple[int, list[str]]:
    stamp: int | None = None
    digests: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        # ASCII digits, few enough for int(): `²` is a digit to isdigit(), and int() refuses
        # thousands of digits (a ValueError, not InvalidSignature, a receiver's 500)
        if name == "t" and value.isascii() and value.isdigit() and len(value) <= 20:
            stamp = int(value)
        elif name == "v1" and value:
            digests.append(value)
    if stamp is None or not digests:
        raise InvalidSignature("signature header needs t=<timestamp> and v1=<digest>")
    return stamp, digests


def verify(
    secret: str,
    body: bytes,
    header: str,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> int:
    """Check a delivery; returns its timestamp. Raises InvalidSignature when no `v1` digest
    matches (compared in constant time) or the timestamp is further than `tolerance_s` away."""
    stamp, digests = _parse(header)
    expected = _digest(secret, stamp, body)
    # bytes: compare_digest raises TypeError for non-ASCII str (a hostile header was a 500)
    if not any(hmac.compare_digest(expected.encode(), d.encode()) for d in digests):
        raise InvalidSignature("signature does not match the body")
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance_s:
        raise InvalidSignature(f"timestamp {stamp} is more than {tolerance_s:.0f}s from now")
    return stamp
