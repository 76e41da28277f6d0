"""Webhook delivery as a Celery task, so a delivery outlives the process that asked for it:
POST the signed event, retry with exponential backoff and jitter for a bounded time
(`CONVEYOR_WEBHOOK_RETRY_FOR_S`), no sooner than a receiver's 429 or 503 asks in Retry-After
(a 4xx that refuses the request itself is not retried), and record every attempt on the hash
of the job or of the Batch API job (target kind `batch`) the event is about (a canary's, kind
`canary`, only in the log).

Events are queued by name (`shared.webhook_events.WebhookDispatcher`): by the producer when a
Batch API job ends, a job is cancelled or a canary decides, by workers when a job with a
webhook ends (`workers/partition/job_events.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any, TypeVar, cast

import httpx
import redis
from celery import Task
from celery.exceptions import Reject, Retry
from redis.exceptions import RedisClusterException

from shared.celery_broker import VISIBILITY_TIMEOUT_S
from shared.codec import dumps
from shared.keys import Keys
from shared.redis_client import blocking_client, blocking_cluster, may_have_run
from shared.redis_clock import CLOCK
from shared.retry_after import retry_after_s as parse_retry_after
from shared.settings import Settings, get_settings
from shared.webhook_events import TASK_NAME, TargetKind, allowed
from shared.webhook_signing import HEADER, owner_secret, sign
from workers.app import app
from workers.runtime.broker_consumer import stoppable_sleep

log = logging.getLogger(__name__)
T = TypeVar("T")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 prefixes whose last 32 bits are an IPv4 address: NAT64's well-known one, IPv4-compatible,
# SIIT's IPv4-translated (RFC 2765), which Python calls global whatever they carry
IPV4_CARRIERS = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96")
)
# NAT64's local-use prefix (RFC 8215): a site's own translator, which reaches any IPv4 address
# behind it (its private ones too), never globally reachable; Python before 3.13 calls it global.
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")

# What a Redis out of reach raises here: a cluster client that cannot reach a node to start from
# raises RedisClusterException, no RedisError (escaped, it dropped the delivery for good).
UNREACHABLE = (redis.RedisError, RedisClusterException)
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0
# Doublings past which the backoff is capped: 2 ** (attempt - 1) for an attempt past 1024 is no
# float (OverflowError), which a 3-day retry window, Stripe's, reaches.
BACKOFF_DOUBLINGS = math.ceil(math.log2(BACKOFF_CAP_S / BACKOFF_BASE_S))
# The 4xx answers worth another attempt: a receiver that timed the request out (408), asks it
# sent later (425) or is rate limited (429). Any other 4xx says the request itself is refused
# (a wrong URL, a signature the receiver does not verify): it fails at once, as Amazon SNS
# fails it, instead of knocking for the whole retry window.
RETRIED_4XX = frozenset({408, 425, 429})
# A receiver whose attempt failed slowly (in a tenth of the timeout or more) is held this many
# times as long as the attempt took: it takes at most a seventh of a worker's delivery time
# however many of its deliveries queue, whether it hangs or answers a 500 just in time.
HOLD_TIMES = 6
SLOW_FAILURE_TIMEOUTS = 0.1
# An attempt's claim holds while it runs (a POST ends within the timeout), then, once recorded,
# past the retry window and a copy of its last attempt that kombu restores a visibility timeout
# later. A worker that died mid-attempt leaves a claim that lapses, so a restored copy runs it.
CLAIM_RUNNING_MARGIN_S = 60.0
CLAIM_KEPT_MARGIN_S = VISIBILITY_TIMEOUT_S
# The longest wait between two tries to queue a next attempt the broker refused (`_queue_next`):
# a broker that takes writes again is found soon.
REQUEUE_WAIT_CAP_S = 10.0
# What an attempt whose connection closed before an answer was read records (`_failure`).
UNANSWERED = (
    "connection closed before an answer was read (a receiver that answers a large body early,"
    " a 413, and closes without reading it is read so: it must read or drain the body)"
)


def backoff_s(attempt: int) -> float:
    """Equal jitter: half of the exponential step is fixed, half random, so a failing receiver
    is not hit by all its retries at once and no retry comes back immediately."""
    step = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(attempt - 1, BACKOFF_DOUBLINGS))
    return step / 2 + random.uniform(0, step / 2)


def retry_delay_s(attempt: int, retry_after_s: float | None) -> float:
    """How long before the attempt after `attempt`: the backoff, or longer when the receiver
    asked for more (a rate limit, a maintenance window), up to the backoff's cap."""
    delay = backoff_s(attempt)
    if retry_after_s is None:
        return delay
    return max(delay, min(retry_after_s, BACKOFF_CAP_S))


def retry_after_s(status: int, value: str | None) -> float | None:
    """The wait a 429 or 503 asks for in Retry-After; None when it asks none."""
    if status not in (429, 503) or not value:
        return None
    return parse_retry_after(value)


@cache
def _redis() -> redis.Redis:
    """The task's blocking client (a cluster client on a cluster: the hashes it records on
    live in their jobs' or batches' slots)."""
    settings = get_settings()
    timeout = settings.redis_timeout_s
    options = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if settings.redis_cluster:
        seeds = settings.redis_cluster_nodes
        return cast(redis.Redis, blocking_cluster(settings.redis_url, seeds, **options))
    return blocking_client(settings.redis_url, **options)  # all its commands are safe to resend


def _target_key(kind: TargetKind, target_id: str) -> str | None:
    """The hash that keeps the attempts of an event about `target_id`; None for a canary's,
    whose attempts the log alone keeps (it was handed over as a job that never exists, each
    attempt sent to a hash that was never there)."""
    if kind == "canary":
        return None
    keys = Keys(get_settings().key_prefix)
    return keys.batch(target_id) if kind == "batch" else keys.job(target_id)


# Appends an attempt (ARGV[1], a JSON object) to the hash's `webhook_attempts` array and sets
# its `webhook_status` (ARGV[2]) at once, inside the hash's lifetime: a hash that expired (or
# expires between two steps of a read-then-write) is not brought back as a key with no TTL.
# A rerun (the client resends a script whose reply was lost, `_redis`) finds its attempt there and
# writes nothing: it was listed twice. An attempt carries its number and its time to the
# millisecond, so two real ones do not match; and `{"` never occurs inside a JSON string (its
# quote is escaped), so a match starts at an attempt of the flat array and, a whole object, is
# that attempt.
_APPEND_ATTEMPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local current = redis.call('HGET', KEYS[1], 'webhook_attempts')
if current and string.find(current, ARGV[1], 1, true) then return 1 end
local attempts = '[' .. ARGV[1] .. ']'
if current and #current > 2 then
  attempts = string.sub(current, 1, -2) .. ',' .. ARGV[1] .. ']'
end
redis.call('HSET', KEYS[1], 'webhook_attempts', attempts, 'webhook_status', ARGV[2])
return 1
"""


class AttemptLog:
    """Every delivery attempt on the hash of the job or batch the event is about."""

    def __init__(self, client: redis.Redis) -> None:
        self._append = client.register_script(_APPEND_ATTEMPT)

    def record(self, key: str, attempt: dict[str, Any], status: str) -> bool:
        """False when the hash is gone (nothing is written)."""
        return bool(self._append(keys=[key], args=[dumps(attempt), status]))


@cache
def _attempt_log() -> AttemptLog:
    return AttemptLog(_redis())


class ReceiverHolds:
    """Receivers whose attempt failed slowly are held: their other deliveries wait out the hold,
    recorded as attempts not tried, instead of each taking up to the timeout on one of the
    worker's few delivery threads, every other tenant's delivery behind them (a receiver
    hanging on a burst of events held it for the timeout a hundred times over; one that
    answered a 500 just before the timeout was never held, and 16 of its deliveries, each
    retried some 25 times in an hour, took a worker's whole delivery time). Bookkeeping, like
    the attempt log: a Redis error holds nothing and stops no delivery. `client` is asked for
    the client at each use: a cluster client is made by reaching a node, which can fail too."""

    def __init__(self, client: Callable[[], redis.Redis], keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def left_s(self, url: str) -> float:
        """How long the receiver of `url` stays held (0: it is not)."""
        try:
            left_ms = int(self.client().pttl(self.keys.webhook_hold(_origin(url))))
        except UNREACHABLE as exc:
            log.warning("webhook hold of %s not read: %r", _origin(url), exc)
            return 0.0
        return max(left_ms, 0) / 1000.0

    def hold(self, url: str, seconds: float) -> None:
        """Hold the receiver of `url` `seconds` from now, or longer if it is held longer: two
        of its deliveries fail together on two threads, and the one that failed quicker, ending
        last, shortened the hold the slower one set (a receiver that hangs was tried again a
        second later). One round trip: the SET makes a hold, PEXPIRE GT lengthens one."""
        key = self.keys.webhook_hold(_origin(url))
        hold_ms = max(1, int(seconds * 1000))
        try:
            with self.client().pipeline(transaction=False) as pipe:
                pipe.set(key, 1, px=hold_ms, nx=True)
                pipe.pexpire(key, hold_ms, gt=True)
                pipe.execute()
        except UNREACHABLE as exc:
            log.warning("webhook hold of %s not set: %r", _origin(url), exc)


def _origin(url: str) -> str:
    """Who receives at `url`, for a hold and for the log: its path and query often carry the
    receiver's credential (Slack's /services/…/<secret>, a `?token=`), and its userinfo does."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode()}"


@cache
def _receiver_holds() -> ReceiverHolds:
    return ReceiverHolds(_redis, Keys(get_settings().key_prefix))


def _claimed_before(task_id: str | None, retries: int) -> bool:
    """Whether another copy of this attempt took it first: kombu hands a delivery left
    unacknowledged past its visibility timeout to another worker even while its own still
    holds it (Celery prefetches countdown tasks and acknowledges them once run), and both
    copies posted, then both retried. One SET NX per attempt lets one copy through; it lapses
    unless the attempt is recorded (`_keep_claim`), so a copy of an attempt whose worker died
    in it runs. A direct call (no task id) has no copy. Redis out of reach claims nothing and
    the attempt is sent: at least once beats none (a copy may post it again). The claim holds a
    token of this call, read back as it is set: redis-py sends a SET again whose reply was lost,
    and a bare SET NX that found its own first write took it for another copy's (the delivery
    returned "duplicate" and was dropped for good)."""
    mine = uuid.uuid4().hex

    def take(client: redis.Redis, key: str, settings: Settings) -> bool:
        ttl_s = int(settings.webhook_timeout_s + CLAIM_RUNNING_MARGIN_S)
        first = client.set(key, mine, nx=True, get=True, ex=ttl_s)
        return first is not None and first != mine.encode()

    return _on_claim(task_id, retries, take, "not claimed, sent anyway")


def _keep_claim(task_id: str | None, retries: int) -> None:
    """The attempt ran: its claim now outlives any copy of it kombu could still restore (with
    Redis out of reach it lapses: a late copy may post the attempt again)."""

    def keep(client: redis.Redis, key: str, settings: Settings) -> bool:
        return bool(client.expire(key, int(settings.webhook_retry_for_s + CLAIM_KEPT_MARGIN_S)))

    _on_claim(task_id, retries, keep, "claim not kept")


def _on_claim(
    task_id: str | None,
    retries: int,
    command: Callable[[redis.Redis, str, Settings], bool],
    unreached: str,
) -> bool:
    """`command` on the claim of one attempt (`_claimed_before`, `_keep_claim`): its answer, or
    False with no task id (a direct call has no copy) or with Redis out of reach, logged as
    `unreached` (what the attempt does without it)."""
    if task_id is None:
        return False
    settings = get_settings()
    key = Keys(settings.key_prefix).webhook_claim(task_id, retries)
    try:
        return command(_redis(), key, settings)
    except UNREACHABLE as exc:
        log.warning("webhook attempt %s/%d %s: %r", task_id, retries, unreached, exc)
        return False


def _record(kind: TargetKind, target_id: str, attempt: dict[str, Any], status: str) -> None:
    """Bookkeeping, which never decides whether the event is retried: a Redis error here (a
    blip, a failover of the node holding the hash) escaped the task, which Celery then
    acknowledged, so the delivery was dropped for good after a failed attempt."""
    if (key := _target_key(kind, target_id)) is None:
        return
    try:
        _attempt_log().record(key, attempt, status)
    except UNREACHABLE as exc:
        # a try whose reply was lost may have recorded it (the client sends it again, and a
        # record sent again adds nothing): only one that reached no server recorded nothing
        outcome = "recorded or not, unknown" if may_have_run(exc) else "not recorded"
        log.warning("webhook attempt on %s %s %s: %r", kind, target_id, outcome, exc)


class PrivateAddress(httpx.TransportError):
    """A receiver's name resolves to an address that is not public (loopback, private,
    link-local, IPv4-mapped or 6to4 one of those): the name is its tenant's to point anywhere
    (its own domain under a `*.` rule), the worker's network is not."""


def _public(address: IPAddress) -> bool:
    """Whether `address`, and any IPv4 address it carries, is globally routable unicast. IPv6's
    deprecated site-local range (fec0::/10, the private range before fc00::/7, RFC 3879) is
    private: Python calls it global."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in LOCAL_NAT64 or address.is_site_local:
            return False
        carried = _carried(address)
        if carried is not None and not _public(carried):
            return False
    return address.is_global and not address.is_multicast


def _carried(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: mapped, 6to4, NAT64's or IPv4-compatible (which
    Python calls global whatever they carry)."""
    if any(address in prefix for prefix in IPV4_CARRIERS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.ipv4_mapped or address.sixtofour


async def _pinned(url: httpx.URL) -> tuple[list[httpx.URL], dict[str, str], dict[str, Any]]:
    """The URLs to connect to for `url`, in turn, with the Host header and TLS server name of
    `url`: an address written in the URL as it is (the allow-list named it literally), a name
    looked up once and each of its addresses taken, in the resolver's order, if every one is
    public or the operator named it internal (PrivateAddress if not). The connection goes to an
    address checked: the HTTP client's own lookup of the name could answer otherwise (DNS
    rebinding)."""
    host = url.raw_host.decode("ascii")
    try:
        ipaddress.ip_address(host)
        return [url], {}, {}
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, url.port, type=socket.SOCK_STREAM
        )
    except OSError as exc:  # no such name: a network error, as the HTTP client's lookup said
        raise httpx.ConnectError(str(exc)) from exc
    addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found]
    refused = next((a for a in addresses if not _public(a)), None)
    if refused is not None and host not in get_settings().webhook_internal_hosts:
        message = f"{host} resolves to {refused}, not a public address"
        raise PrivateAddress(f"{message} (nor in CONVEYOR_WEBHOOK_INTERNAL_HOSTS)")
    extensions: dict[str, Any] = {"sni_hostname": host} if url.scheme == "https" else {}
    targets = [url.copy_with(host=str(address)) for address in addresses]
    return targets, {"Host": url.netloc.decode("ascii")}, extensions


async def _answer(
    url: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, str | None]:
    """The receiver's status code and Retry-After; its body is never read (an endless one cost
    memory). An address that refuses the connection (or has no route) is passed for the next,
    as the HTTP client's own connect does: only the first was tried, and a receiver whose first
    address was down (one of a round robin's, an AAAA with no route) failed every attempt. So is
    one that does not connect within its share of the timeout: one dropping connection attempts
    (no reset) took the whole timeout, and the next address was never tried."""
    targets, host, extensions = await _pinned(httpx.URL(url))
    *fallbacks, last = targets
    whole = httpx.Timeout(timeout_s)
    share = httpx.Timeout(timeout_s, connect=timeout_s / len(targets))
    async with httpx.AsyncClient() as client:
        for target in fallbacks:
            with contextlib.suppress(httpx.ConnectError, httpx.ConnectTimeout):  # nothing sent
                return await _status(client, target, body, headers | host, extensions, share)
        return await _status(client, last, body, headers | host, extensions, whole)


async def _status(
    client: httpx.AsyncClient,
    target: httpx.URL,
    body: bytes,
    headers: dict[str, str],
    extensions: dict[str, Any],
    timeout: httpx.Timeout,
) -> tuple[int, str | None]:
    """One POST's status code and Retry-After, its body unread."""
    async with client.stream(
        "POST", target, content=body, headers=headers, extensions=extensions, timeout=timeout
    ) as response:
        return response.status_code, response.headers.get("Retry-After")


class _Unwaited(ThreadPoolExecutor):
    """An attempt's loop's executor, where the receiver's name is looked up (getaddrinfo, which
    nothing can stop): shut down as the loop closes, it waits for no lookup, so an attempt ends
    at its timeout (the loop's own executor held the worker as long as a slow DNS took). A
    lookup left running ends on its own; its answer is dropped."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=True)


def _within(answer: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """`answer` run on a loop of its own, given up after `timeout_s` (TimeoutError)."""
    with asyncio.Runner() as runner:
        runner.get_loop().set_default_executor(_Unwaited(thread_name_prefix="webhook-dns"))
        return runner.run(asyncio.wait_for(answer, timeout_s))


def _signing_key(secret: str, event: dict[str, Any]) -> str:
    """The key that signs `event`: its owner's (`tenant`), or for an event that names none
    (handed over by a producer or worker of an older release, still queued in the broker) the
    operator's secret itself, as that release signed it."""
    owner = event.get("tenant")
    return secret if owner is None else owner_secret(secret, str(owner))


def _previous_key(event: dict[str, Any]) -> str:
    """The key `event` was signed with before CONVEYOR_WEBHOOK_SECRET was rotated ('' for
    none): signed with both meanwhile, no receiver fails a delivery while it changes keys."""
    previous = get_settings().webhook_previous_secret
    return _signing_key(previous, event) if previous else ""


def _post(url: str, body: bytes, event: dict[str, Any]) -> dict[str, Any]:
    """One attempt, answered within CONVEYOR_WEBHOOK_TIMEOUT_S as a whole (httpx's timeout
    bounds each read: a receiver trickling a byte a second held a delivery thread, and the
    worker's own exit, which waits for its threads), the receiver's name lookup
    included (`_Unwaited`); never raises. Redirects are not followed (they could leave the
    allow-list). Signed with the key of the event's owner (`_signing_key`)."""
    settings = get_settings()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Conveyor-Webhooks/1",
        "Conveyor-Event-Id": str(event.get("id", "")),
        "Conveyor-Event-Type": str(event.get("type", "")),
        HEADER: sign(
            _signing_key(settings.webhook_secret, event), body, previous=_previous_key(event)
        ),
    }
    started = time.monotonic()
    outcome: dict[str, Any] = {"at": round(time.time(), 3), "status_code": None, "error": None}
    timeout_s = settings.webhook_timeout_s
    try:
        status, retry_after = _within(_answer(url, body, headers, timeout_s), timeout_s)
        outcome["status_code"] = status
        if not httpx.codes.is_success(status):
            outcome["error"] = f"HTTP {status}"
        if (asked := retry_after_s(status, retry_after)) is not None:
            outcome["retry_after_s"] = round(asked, 3)
    except TimeoutError:
        outcome["error"] = f"TimeoutError: no answer within {timeout_s:g}s"
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:
        outcome["error"] = _failure(exc)
    took_s = time.monotonic() - started
    outcome["duration_ms"] = round(took_s * 1000, 1)
    if _overloaded(outcome, took_s, timeout_s):
        # the receiver's part is the timeout at most: past it, this worker did not run (a
        # SIGSTOP, a VM migrated) and held a healthy receiver 120 s for a 10 s timeout
        _receiver_holds().hold(url, HOLD_TIMES * min(took_s, timeout_s))
    return outcome


def _failure(exc: Exception) -> str:
    """An attempt's error as the HTTP client says it, or for a ReadError that says nothing (a
    connection closed or reset before an answer was read) what it is: the attempt's record read
    "ReadError: ". A receiver that answers a large body early (a 413) and closes without reading
    it is read so, and retried: the HTTP client's asyncio stream reads only while a read waits,
    and its failed write closes it, the answer unread (a blocking socket reads it)."""
    said = str(exc) or (UNANSWERED if isinstance(exc, httpx.ReadError) else "")
    return f"{type(exc).__name__}: {said}"


def _overloaded(outcome: dict[str, Any], took_s: float, timeout_s: float) -> bool:
    """Whether an attempt's failure says its origin is overloaded, so it is held: it failed
    slowly, and not by a 4xx refused for good (a receiver that answers a client error about one
    URL is up, and each such delivery fails at once, never retried: a shared receiver's, Slack's
    or a gateway's, held every other tenant's deliveries there for one tenant's bad URL)."""
    if not outcome["error"] or _refused_for_good(outcome["status_code"]):
        return False
    return took_s >= SLOW_FAILURE_TIMEOUTS * timeout_s


def _held(url: str) -> dict[str, Any] | None:
    """The attempt not tried, while the receiver of `url` is held, with the wait left as the
    time the next attempt waits for (as a receiver's Retry-After)."""
    left = _receiver_holds().left_s(url)
    if not left:
        return None
    error = "held: a delivery to the receiver failed slowly; not tried"
    return {"at": round(time.time(), 3), "status_code": None, "error": error, "retry_after_s": left}


def after_attempt(
    number: int, attempt: dict[str, Any], first_attempt_at: float, settings: Settings
) -> tuple[str, float]:
    """The delivery's status after attempt `number`, and how long before the next: `delivered`;
    `failed` at once for a 4xx the receiver would answer again (`RETRIED_4XX`); `retrying`
    after the backoff, or the longer wait the receiver asked for; `failed` once that wait would
    end past `CONVEYOR_WEBHOOK_RETRY_FOR_S` from the first attempt."""
    if attempt["error"] is None:
        return "delivered", 0.0
    if _refused_for_good(attempt.get("status_code")):
        return "failed", 0.0
    delay = retry_delay_s(number, attempt.get("retry_after_s"))
    # Redis's clock, as the dispatching host (a producer, a worker) stamped `first_attempt_at`
    out_of_time = CLOCK.now() + delay > first_attempt_at + settings.webhook_retry_for_s
    return ("failed" if out_of_time else "retrying"), delay


def _refused_for_good(status: int | None) -> bool:
    return status is not None and 400 <= status < 500 and status not in RETRIED_4XX


def _queue_next(task: Task, delay_s: float, until: float) -> Retry:
    """Queue the next attempt `delay_s` from now; returns Celery's Retry, to raise. Celery's
    retry drops the delivery when the broker refuses that publish (Reject, requeue=False:
    Valkey at maxmemory refusing writes, a connection lost past kombu's retries), and nothing
    owes it any more: the webhook was never sent again, its status `retrying` for good. So the
    publish is tried again here, with backoff, until the broker takes it or the retry window
    ends (`until`, on Redis's clock; then it is dropped, logged). The delivery this attempt runs
    stays unacknowledged meanwhile: kombu restores it a visibility timeout after it was taken
    if this worker dies (or is still waiting then), and that copy, this attempt's claim lapsed,
    posts the attempt again (receivers drop a repeat by its id); the next attempt's claim lets
    one of the two go on. Not requeued: kombu's requeue writes to the broker too, and when the
    broker refused it as well, Celery stopped the worker ("Unrecoverable error"). A worker asked
    to stop meanwhile stops (`stoppable_sleep`)."""
    due = time.monotonic() + delay_s
    tries = 0
    while True:
        try:
            return task.retry(countdown=max(0.0, due - time.monotonic()), throw=False)
        except Reject as refused:
            tries += 1
            wait_s = min(backoff_s(tries), REQUEUE_WAIT_CAP_S)
            if CLOCK.now() + wait_s > until:
                log.error(
                    "webhook delivery %s dropped: no next attempt queued within its window",
                    task.request.id,
                )
                raise
            log.warning(
                "webhook delivery %s: next attempt not queued (%r), tried again in %.1fs",
                task.request.id,
                refused.reason,
                wait_s,
            )
            # A worker asked to stop (SIGTERM, Ctrl-C, a crash or memory recycle of the
            # consumer) raises WorkerShutdown out of the task, leaving the delivery unacknowledged
            # for kombu to restore. The wait runs on a pool thread, which a stopping worker waits
            # for (on the solo pool it was the main thread, which looks at the stop flags only
            # between tasks: the worker ran on until it was killed).
            stoppable_sleep(wait_s)


def _never_queued(number: int) -> dict[str, Any]:
    """Attempt `number`, recorded as never made: the broker refused to queue it for the whole
    retry window (`_queue_next`)."""
    error = "not queued: the broker refused the next attempt for the whole retry window"
    return {"attempt": number, "at": round(time.time(), 3), "status_code": None, "error": error}


@app.task(name=TASK_NAME, bind=True, acks_late=True, max_retries=None)
def deliver_webhook(
    self: Task,
    kind: TargetKind,
    target_id: str,
    url: str,
    event: dict[str, Any],
    first_attempt_at: float,
) -> str:
    """Returns the delivery's status: `delivered`, or `failed` once retrying would pass the
    bound (or the URL is no longer allowed); raises Celery's Retry in between. A copy of an
    attempt another copy took (`_claimed_before`) does nothing and returns `duplicate`."""
    settings = get_settings()
    number = self.request.retries + 1
    if _claimed_before(self.request.id, self.request.retries):
        log.info(
            "webhook %s to %s, attempt %d: taken by another copy",
            event.get("id"),
            _origin(url),
            number,
        )
        return "duplicate"
    if not (settings.webhook_secret and allowed(url, settings.webhook_allowlist)):
        refused = "refused: URL not allowed or no secret"
        attempt: dict[str, Any] = {"at": round(time.time(), 3), "error": refused}
        status, delay = "failed", 0.0
    else:
        attempt = _held(url) or _post(url, dumps(event), event)
        status, delay = after_attempt(number, attempt, first_attempt_at, settings)
    _record(kind, target_id, {"attempt": number, **attempt}, status)
    log.info("webhook %s to %s, attempt %d: %s", event.get("id"), _origin(url), number, status)
    if status == "retrying":
        # kept once the next attempt is queued: a worker that died before that left the claim
        # to lapse, and the copy kombu restores runs this attempt again, not "duplicate"
        try:
            retry = _queue_next(self, delay, first_attempt_at + settings.webhook_retry_for_s)
        except Reject:  # dropped: the hash says it will not be sent, not `retrying` for good
            _record(kind, target_id, _never_queued(number + 1), "failed")
            raise
        _keep_claim(self.request.id, self.request.retries)
        raise retry
    _keep_claim(self.request.id, self.request.retries)
    return status
