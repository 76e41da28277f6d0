"""Webhook events, as producer and workers agree on them: which URLs may be called (the
allow-list, so a client cannot make Conveyor reach internal services), the event envelope, and
how an event is handed to the Celery task that delivers it (`workers/webhook_delivery.py`), so
deliveries survive producer restarts."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

import httpx
from celery import Celery
from celery.signals import before_task_publish

from shared.celery_broker import broker_app
from shared.redis_clock import CLOCK
from shared.settings import Settings

log = logging.getLogger(__name__)

TASK_NAME = "conveyor.deliver_webhook"
_DEFAULT_PORTS = {"http": 80, "https": 443}

# What an event is about, which keeps its delivery's attempts: a job's or a Batch API job's hash.
# A canary's (its model) keeps none: its record holds its decisions (shared/canary_store.py), and
# the worker's log its deliveries.
TargetKind = Literal["job", "batch", "canary"]


def _port(parts: SplitResult) -> int | None:
    """The port a request to `parts` goes to (None: none it can go to). An explicit port 0 is
    port 0, not the default: `parts.port or default` let `http://host:0/` match `http://host`,
    a 202 at submit for a webhook whose every attempt failed to connect."""
    try:
        port = parts.port
    except ValueError:
        return None
    return _DEFAULT_PORTS.get(parts.scheme) if port is None else port


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def _path_matches(path: str, prefix: str) -> bool:
    if prefix in ("", "/") or path == prefix:
        return True
    return path.startswith(prefix if prefix.endswith("/") else prefix + "/")


# What no HTTP request can carry in its URL: whitespace and control characters.
UNSENDABLE = re.compile(r"[\x00-\x20\x7f]")
# The longest name and label DNS carries (RFC 1035), in octets as the name is looked up.
MAX_NAME_OCTETS = 253
MAX_LABEL_OCTETS = 63
# A host name's label (RFC 1123, and `_`, which DNS carries and Docker's and Compose's service
# names use): letters, digits, underscores and inner hyphens; IDNA's `xn--` labels are of
# these, and checked as IDNA by the HTTP client's decoding (`_sent_path`).
HOST_LABEL = re.compile(rb"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?", re.IGNORECASE)


# What receivers (and proxies in front of them) may read otherwise than the HTTP client sends
# it: an empty segment (merged away, so a `..` after it climbs further), escaped `.`, `/` and
# `\` (sent as they are, decoded into dot segments and separators), a backslash (a separator
# to some servers), a `;`, bare or escaped (Tomcat and Spring strip a segment's `;params`
# before resolving dot segments: `/conveyor/..;/manager` reaches `/manager`).
AMBIGUOUS_PATH = re.compile(r"//|%2e|%2f|%5c|\\|;|%3b", re.IGNORECASE)


def _sent_path(url: str) -> str | None:
    """The path the HTTP client sends for `url`, dot segments removed as it removes them
    (RFC 3986), decoded; None when it cannot send to `url` at all (a host label no IDNA
    encoding takes, `\u0661.example.com`, or an `xn--` label that decodes to none,
    `xn--.example.com`, matched a `*.` rule and was accepted at submit, then
    failed its delivery with no attempt on record; a name DNS cannot carry, `_resolvable`) or
    when a receiver may read the path otherwise (`AMBIGUOUS_PATH`). A normalisation of the
    check's own (posixpath's drops empty segments before `..`) let `/admin//..//hooks/x`
    through as `/hooks/x`; it was sent as `/admin//hooks/x`."""
    try:
        target = httpx.URL(url)
        target.host  # noqa: B018 - decodes each `xn--` label; IDNAError for one IDNA refuses
    except (httpx.InvalidURL, UnicodeError):
        return None
    if not _resolvable(target.raw_host):
        return None
    raw_path = target.raw_path.split(b"?", 1)[0].decode("ascii", "replace")
    return None if AMBIGUOUS_PATH.search(raw_path) else target.path


def _resolvable(host: bytes) -> bool:
    """Whether DNS can carry `host` as sent (IDNA-encoded), or it is an IP literal: a label
    over 63 octets or a name over 253 matched a `*.` rule and was accepted at submit, then
    every attempt failed its lookup for the whole retry window. Labels are host-name labels
    (`HOST_LABEL`): `evil.com\\.example.com` or `a%2e.example.com` matched `*.example.com`
    too, and a resolver may read the `\\.` as an escaped dot, outside the rule's suffix."""
    if _ip_literal(host):
        return True
    labels = host.split(b".")
    return len(host) <= MAX_NAME_OCTETS and all(
        len(label) <= MAX_LABEL_OCTETS and HOST_LABEL.fullmatch(label) for label in labels
    )


def _ip_literal(host: bytes) -> bool:
    """Whether `host` is an IPv4 or IPv6 address (a rule's exact host; no `*.` rule matches)."""
    try:
        ipaddress.ip_address(host.decode("ascii"))
    except (ValueError, UnicodeError):
        return False
    return True


def allowed(url: str, allowlist: list[str]) -> bool:
    """True if `url` matches an entry `scheme://host[:port][/path-prefix]` of the allow-list
    (`*.example.com` matches subdomains). Scheme, host and port must match exactly, the path
    as the HTTP client sends it (`_sent_path`); URLs with credentials, fragments or other
    schemes never match."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # not a URL: an unclosed IPv6 literal (`http://[::1/`)
        return False
    if parts.scheme not in _DEFAULT_PORTS or not host or "@" in parts.netloc:
        return False
    if not _port(parts):  # out of range, or 0: no receiver can listen there
        return False
    if UNSENDABLE.search(url) or "" in host.split("."):
        return False  # a control character or an empty host label: the HTTP client refuses it
    if parts.fragment or (path := _sent_path(url)) is None:
        return False
    for entry in allowlist:
        rule = urlsplit(entry.strip())
        if (
            rule.scheme == parts.scheme
            and rule.hostname is not None
            and _host_matches(host, rule.hostname)
            and _port(rule) == _port(parts)
            and _path_matches(path, rule.path)
        ):
            return True
    return False


def refusal(url: str, settings: Settings) -> str | None:
    """Why a webhook URL cannot be accepted at submit, or None when it can."""
    if not settings.webhook_secret:
        return "webhooks are disabled: CONVEYOR_WEBHOOK_SECRET is not set"
    if not allowed(url, settings.webhook_allowlist):
        return f"webhook URL {url!r} is not in CONVEYOR_WEBHOOK_ALLOWLIST"
    return None


def event(
    event_type: str,
    owner: str,
    data: dict[str, Any],
    event_id: str | None = None,
    created: float | None = None,
) -> dict[str, Any]:
    """The JSON body of one delivery; `id` is stable across retries so receivers can dedupe
    (`event_id`: one that names the event itself, for an event two producers may both hand
    over), and so is `created` when given (Unix seconds the event happened; now if not, on
    Redis's clock as a job event's `finished` is, so receivers order both kinds alike).
    `tenant` names its owner (a tenant, or `shared.webhook_signing.OPERATOR` for the
    operator's own events), whose key signs it (`workers/webhook_delivery.py`)."""
    return {
        "id": f"evt_{event_id or uuid.uuid4().hex}",
        "type": event_type,
        "created": int(CLOCK.now() if created is None else created),
        "tenant": owner,
        "data": data,
    }


def job_event(view: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A job's event, `job.<status>`, from its public view, owned by the job's tenant. Its id
    names the job and the status it ended in: the same for the first hand-over and for any
    re-send of one a dead worker may have lost (the reclaimer's, workers/partition/reclaim.py),
    so receivers dedupe on it. Its `created` is the job's end (`timings.finished`), likewise
    the same for each: a re-send stamped with its own clock told a receiver the event happened
    a visibility timeout or more after it did."""
    status = view["status"]
    ended = view.get("timings", {}).get("finished")
    return event(f"job.{status}", tenant, view, f"{view['id']}_{status}", ended)


def _log_safe_arguments(headers: dict[str, Any] | None = None, body: Any = None, **_: Any) -> None:
    """Sets what Celery logs of a delivery's arguments (its `kwargsrepr`, in the worker's "Task
    … received" and "… succeeded" lines at INFO) to the delivery's target and event id. Celery's
    own repr named the URL in full, whose path and query often carry the receiver's credential
    (the worker's own lines name its origin alone), and the event's data. Connected to every
    publish of the task, so a retry's, which Celery builds without the first's, gets it too."""
    kwargs = body[1] if isinstance(body, (list, tuple)) and len(body) > 1 else None
    if headers is None or not isinstance(kwargs, dict):
        return
    event = kwargs.get("event")
    event_id = event.get("id") if isinstance(event, dict) else None
    shown = {"kind": kwargs.get("kind"), "target_id": kwargs.get("target_id"), "event": event_id}
    headers["kwargsrepr"] = repr(shown)


before_task_publish.connect(_log_safe_arguments, sender=TASK_NAME, weak=False)


@dataclass
class WebhookDispatcher:
    """Hands deliveries to the Celery task by name (no import of the worker code)."""

    broker_url: str

    @cached_property
    def _celery(self) -> Celery:
        return broker_app(self.broker_url)

    async def hand_over(
        self, kind: TargetKind, target_id: str, url: str, body: dict[str, Any]
    ) -> bool:
        """`send` from async code, for an event that reports what is already done (a result
        written, a cancel committed): a broker that refuses it once kombu has retried the
        publish is logged and fails nothing (a worker's loop ended; a cancel answered 500, and
        the client's retry 409). False then, for a caller that can hand it over again later."""
        try:
            await asyncio.to_thread(self.send, kind, target_id, url, body)
        except Exception as exc:
            log.error(
                "webhook %s of %s %s not handed to delivery: %r", body["type"], kind, target_id, exc
            )
            return False
        return True

    def send(self, kind: TargetKind, target_id: str, url: str, body: dict[str, Any]) -> None:
        """Blocking (the broker publish): call it from a thread in async code."""
        self._celery.send_task(
            TASK_NAME,
            kwargs={
                "kind": kind,
                "target_id": target_id,
                "url": url,
                "event": body,
                # Redis's clock: the webhook worker, on another host, ends the retry window
                "first_attempt_at": CLOCK.now(),
            },
        )
