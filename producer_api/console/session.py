"""Console sessions: an API key is presented once on the login page; the producer then keeps
only the key's public id in an HttpOnly, SameSite=Strict cookie signed with HMAC-SHA256
(CONVEYOR_CONSOLE_SECRET, random per process when unset). Each request re-reads the key's record,
so revocation and expiry end a session at once, and so do logging out and the idle timeout
(`live_sessions.py`); a live feed opened in it ends within CONVEYOR_STREAM_RECHECK_S (a Redis that
does not answer ends none). Each session carries a nonce; its CSRF token is an HMAC of that nonce,
checked on every POST. A session's expiry is stamped and judged on Redis's clock
(`shared/redis_clock.py`), as its key's is: replicas sharing CONVEYOR_CONSOLE_SECRET on hosts a
minute apart kept a cookie a minute longer on one."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass

from fastapi import Request
from redis.exceptions import RedisError

from producer_api.auth import ANONYMOUS, Principal
from producer_api.auth.dependencies import admit_key
from producer_api.console.live_sessions import LiveSessions
from producer_api.console.login_throttle import LoginThrottle
from producer_api.errors import ConveyorError
from producer_api.state import ProducerState
from shared.api_keys import ApiKey
from shared.codec import dumps, loads
from shared.redis_clock import CLOCK

COOKIE = "conveyor_console"
LOGIN_COOKIE = "conveyor_console_login"
MAX_AGE_S = 12 * 3600
LOGIN_MAX_AGE_S = 600


class LoginRequired(Exception):
    """No valid session: the router answers with a redirect to the login page."""


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    principal: Principal
    csrf: str
    nonce: str = ""  # none for the anonymous admin, who has no session to end
    expires: float = math.inf  # Unix seconds

    @property
    def admin(self) -> bool:
        return self.principal.may("admin")

    def reaches(self, model: str) -> bool:
        """Whether the session sees jobs and batches of `model`: an admin, who sees every
        tenant's, only of the models its key may use (`/v1` answers 403 for the others); anyone
        else, cut to their tenant's, of any model, as on `/v1`. A batch whose every line was
        invalid has no model."""
        return not self.admin or not model or self.principal.may_use(model)


def same(presented: str, expected: str) -> bool:
    """A constant-time comparison that any presented text survives: compare_digest raises
    TypeError for non-ASCII str (a cookie or token of one was a 500, not a login page)."""
    return hmac.compare_digest(presented.encode(), expected.encode())


class SessionSigner:
    def __init__(self, secret: str) -> None:
        self._secret = secret.encode() if secret else secrets.token_bytes(32)

    def _mac(self, purpose: str, data: bytes) -> str:
        digest = hmac.new(self._secret, purpose.encode() + b"|" + data, hashlib.sha256)
        return digest.hexdigest()

    def issue(self, key_id: str, max_age_s: float = MAX_AGE_S) -> tuple[str, str]:
        """A cookie value (base64 JSON {key_id, nonce, expiry} and its MAC) and its fresh nonce,
        whose `csrf` token goes with it. The login form gets one with no key id, so logging in
        needs a token too (no login CSRF)."""
        nonce = secrets.token_hex(16)
        payload = dumps({"k": key_id, "n": nonce, "e": CLOCK.now() + max_age_s})
        body = base64.urlsafe_b64encode(payload).decode()
        return f"{body}.{self._mac('session', body.encode())}", nonce

    def read(self, cookie: str) -> tuple[str, str, float] | None:
        """(key_id, nonce, expiry) of a cookie this producer signed and that has not expired."""
        body, _, mac = cookie.partition(".")
        if not same(mac, self._mac("session", body.encode())):
            return None
        payload = loads(base64.urlsafe_b64decode(body))
        if payload["e"] < CLOCK.now():
            return None
        return str(payload["k"]), str(payload["n"]), float(payload["e"])

    def csrf(self, nonce: str) -> str:
        return self._mac("csrf", nonce.encode())


async def login_key(
    state: ProducerState, logins: LoginThrottle, bucket: str, presented: str
) -> Principal:
    """The principal of a presented key, which must hold `read` (admin includes it); 429 with
    Retry-After once `bucket` (the client's address) failed too often this minute. A key that
    is found counts for nothing, revoked or expired too: its presenter holds its secret, no
    guess (counted, a revoked key's retries locked its whole office out for the minute). The key
    is read once, for both its refusal and its forgiveness: a refused login read it twice."""
    if state.settings.auth == "disabled":
        return ANONYMOUS
    if wait_s := await logins.attempt(bucket):
        message = f"too many failed logins from this address; try again in {wait_s} s"
        raise ConveyorError(429, "rate_limited", message, {"Retry-After": str(wait_s)})
    key = await state.api_keys.verify(presented)
    if key is not None:  # refused or not, found
        await logins.forgive(bucket)
    principal = admit_key(state, key)
    if not principal.may("read"):
        raise ConveyorError(403, "forbidden", "the console needs a key with the read scope")
    return principal


async def current_session(
    state: ProducerState, signer: SessionSigner, sessions: LiveSessions, request: Request
) -> ConsoleSession:
    """The caller's session, or LoginRequired. With CONVEYOR_AUTH=disabled everyone is the
    anonymous admin (local use), still with a CSRF token bound to a per-process nonce."""
    if state.settings.auth == "disabled":
        return ConsoleSession(ANONYMOUS, signer.csrf("anonymous"))
    read = signer.read(request.cookies.get(COOKIE, ""))
    if read is None:
        raise LoginRequired
    key_id, nonce, expires = read
    if (key := await _usable_key(state, sessions, key_id, nonce)) is None:
        raise LoginRequired
    return ConsoleSession(Principal.of(key, state.settings), signer.csrf(nonce), nonce, expires)


async def still_open(state: ProducerState, sessions: LiveSessions, session: ConsoleSession) -> bool:
    """Whether the session a live feed was opened in holds still: not expired, its key not
    revoked, not logged out (from any replica), not idle (the feed renews it), and its key
    allowing what it did at the feed's opening (stored again with fewer scopes or models, it
    went on showing what it no longer may see; the browser's reconnect reopens it as the key
    now allows). A Redis that does not answer cuts no feed, as it cuts no key's stream
    (KeyWatch.holds): the feed was cut with an error, its browser's reconnect met a 503 and
    EventSource gave up for good, every open page stopped."""
    if not session.nonce:
        return True
    if session.expires < CLOCK.now():
        return False
    try:
        key = await _usable_key(state, sessions, session.principal.key_id, session.nonce)
    except RedisError:
        return True
    return key is not None and Principal.of(key, state.settings) == session.principal


async def _usable_key(
    state: ProducerState, sessions: LiveSessions, key_id: str, nonce: str
) -> ApiKey | None:
    """The session's key, unless revoked or expired, or the session logged out of, idle past
    its timeout or opened for another key (`LiveSessions.renewed`); renews the session. A
    session whose key is unusable is ended: refused but renewed by each request, it opened the
    console again once the key was stored again (the development key, at a producer's start)."""
    # the key's record and the session's renewal at once: one round trip's wait, not two
    key, open_ = await asyncio.gather(
        state.api_keys.usable(key_id), sessions.renewed(nonce, key_id)
    )
    if key is None and open_:
        await sessions.close(nonce)
    return key if open_ else None


async def end_replaced(signer: SessionSigner, sessions: LiveSessions, cookie: str) -> None:
    """Ends the session a new login's browser still names: it stayed open until its idle
    timeout, so a copy of its cookie went on opening the console, another user's session
    once someone else logged in on that browser."""
    if (read := signer.read(cookie)) is not None:
        await sessions.close(read[1])


def check_csrf(session: ConsoleSession, presented: str | None) -> None:
    if not presented or not same(presented, session.csrf):
        raise ConveyorError(403, "forbidden", "missing or wrong CSRF token")


def check_login_csrf(signer: SessionSigner, cookie: str, presented: str) -> None:
    """The login form's token must match the pre-login cookie the login page set."""
    read = signer.read(cookie)
    expected = signer.csrf(read[1]) if read is not None else ""
    if not read or not presented or not same(presented, expected):
        raise ConveyorError(
            403, "forbidden", "the login form lapsed or was not this console's; enter the key again"
        )
