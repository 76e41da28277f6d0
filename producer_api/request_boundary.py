"""The one edge every request body crosses before a route sees it: with auth disabled, a request
whose Host is no loopback name, IP literal or allowed name is refused (400, `HostAllowList`: DNS
rebinding); a request to a route that takes an API key has its key verified first (401 whatever
its body: `authenticate_early`), bodies are bounded (413, declared or chunked; batch input by its
own, larger bound), sent as they are (415 for one in a `Content-Encoding`: none is decoded), and
a JSON body must hold only what Conveyor can store and serialise — valid Unicode (no lone
surrogates), integers within 64 bits, finite numbers, at most `CONVEYOR_MAX_JSON_DEPTH` levels of
nesting — anywhere, free-form `inputs` and `parameters` included (422). Checking here, once,
means nothing deeper (orjson, pydantic, Redis) ever meets a value it would fail on."""

from __future__ import annotations

import inspect
import ipaddress
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.auth.dependencies import authenticate_early, keyed
from producer_api.errors import error_response, host_refused, read_as_json
from producer_api.route_path import route_path
from shared.model_repository import client_named
from shared.settings import Settings

# The most (method, path) answers `RequestBoundaryMiddleware._keyed` keeps, and the longest
# path it keeps one for: a route's own paths, ids included, are far shorter, and uvicorn takes
# paths of up to 64 kB, 4096 of which, sent before any key is checked, held some 270 MB.
KEYED_PATHS_KEPT = 4096
KEYED_PATH_MAX = 512
# The most Host values `HostAllowList` keeps its answer for, and the longest Host it serves (and
# keeps one for): a DNS name's 253 characters and a port (an IP literal is shorter still).
HOSTS_KEPT = 1024
HOST_MAX = 262
# A Host header: a name or IPv4 address, or an IPv6 one in brackets; then any port.
HOST_FORM = re.compile(r"(\[[0-9a-f:.]+\]|[^\[\]:]*)(?::[0-9]*)?")
# What a browser on this machine names it by, wherever the DNS points (RFC 6761 6.3).
LOOPBACK_DOMAIN = ".localhost"
# What orjson serialises: signed and unsigned 64-bit integers.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# Where the parsed body waits for the route (an ASGI scope key), so it is parsed once.
PARSED_JSON = "conveyor.parsed_json"
NOT_PARSED = object()
# What a 415 for a body in a content coding names as taken (RFC 9110 12.5.3): the body as is.
UNCODED = {"Accept-Encoding": "identity"}
# A 413 leaves the rest of its body unread: on a kept-alive connection uvicorn would go on
# reading it all (to drop it), so a client sending 1 GB was taken for all of it.
CLOSE = {"Connection": "close"}


class BodyTooLarge(Exception):
    pass


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """The most bytes a body may hold, and the variable that sets it (named in the 413)."""

    max_bytes: int
    setting: str


class UnstorableJson(ValueError):
    """A JSON body that parses but holds a value Conveyor cannot store."""


def _no_constant(name: str) -> None:
    raise UnstorableJson(f"{name} is not a number JSON allows (numbers must be finite)")


def _where(path: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in path) or "body"


def _check_text(text: str, path: tuple[str | int, ...]) -> None:
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise UnstorableJson(f"{_where(path)}: a lone surrogate is not valid Unicode") from None


def _check_scalar(item: Any, path: tuple[str | int, ...]) -> bool:
    """Raise UnstorableJson for a string that is not valid Unicode, an integer beyond 64 bits or
    a number that is not finite; True for a float beyond 64-bit integers."""
    kind = type(item)
    if kind is str:
        _check_text(item, path)
    elif kind is int and not INT_MIN <= item <= INT_MAX:
        raise UnstorableJson(f"{_where(path)}: integer {str(item)[:24]}... does not fit in 64 bits")
    elif kind is float and not abs(item) < -INT_MIN:
        if not math.isfinite(item):
            raise UnstorableJson(f"{_where(path)}: number {item} is not finite")
        return True
    return False


def _items(
    container: dict[str, Any] | list[Any], path: list[str | int], max_depth: int
) -> Iterator[tuple[Any, Any]]:
    """The (key, value) pairs of the container at `path`, once its depth and keys are checked."""
    if len(path) >= max_depth:
        raise UnstorableJson(f"{_where(tuple(path))}: nested deeper than {max_depth} levels")
    if isinstance(container, list):
        return enumerate(container)
    if not all(map(str.isascii, container)):
        for key in container:
            _check_text(key, tuple(path))
    return iter(container.items())


def check_value(value: Any, max_depth: int) -> bool:
    """Raise UnstorableJson when a parsed JSON value nests deeper than `max_depth`, or holds a
    string (keys too) that is not valid Unicode, an integer beyond 64 bits or a number that is
    not finite. True when it holds a float beyond 64-bit integers: orjson reads an oversized
    integer as one. Iterative, so depth costs no recursion, and it holds only the containers
    open and their path: an entry with its own path per value made a 1 MiB array of small
    values cost 80 MB and most of a second of the event loop."""
    if not isinstance(value, dict | list):
        return _check_scalar(value, ())
    path: list[str | int] = []
    open_items = [_items(value, path, max_depth)]
    huge = False
    while open_items:
        for key, item in open_items[-1]:
            kind = type(item)
            if kind is dict or kind is list:
                path.append(key)
                if item or len(path) >= max_depth:  # an empty one has only its depth to check
                    open_items.append(_items(item, path, max_depth))
                    break
                path.pop()
                continue
            fits = (kind is int and INT_MIN <= item <= INT_MAX) or (kind is str and item.isascii())
            if not fits:  # the common values pass without a call
                huge = _check_scalar(item, (*path, key)) or huge
        else:
            open_items.pop()
            if path:
                path.pop()
    return huge


def parse_json(body: bytes, max_depth: int) -> Any:
    """The body as JSON, or UnstorableJson / ValueError saying why it cannot be accepted.
    orjson parses it; a body it refuses, or one holding a float an oversized integer may have
    become, goes through the checking parser, which keeps integers exact and says why."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _parse_checked(body, max_depth)
    return _parse_checked(body, max_depth) if check_value(value, max_depth) else value


def _parse_checked(body: bytes, max_depth: int) -> Any:
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise UnstorableJson(f"body: nested deeper than {max_depth} levels") from None
    check_value(value, max_depth)
    return value


def _content_coding(headers: Headers) -> str:
    """The body's content codings other than `identity`, as sent ('' for none). None is
    decoded here: a gzipped body was read as plain text (a 422 "can't decode byte 0x8b" that sent
    its client looking for a fault in its JSON), and a plain body labelled gzip was taken as
    it came."""
    codings = ", ".join(headers.getlist("content-encoding"))
    named = [coding.strip() for coding in codings.split(",") if coding.strip()]
    return codings if any(coding.lower() != "identity" for coding in named) else ""


def _is_json(at: tuple[str, str], raw: str | None, own_format: frozenset[str]) -> bool:
    """As FastAPI decides from the content type `raw` (`read_as_json`): a body it will not parse
    is left to the route, which refuses it for its type; routes in `own_format` (JSONL uploads)
    parse and check their bodies themselves, line by line. `at` is (method, route path)."""
    if at[1] in own_format and at[0] == "POST":
        return False
    return read_as_json(raw)


async def _unauthenticated(scope: Scope) -> Response | None:
    """The refusal of a request whose key `authenticate_early` did not admit (None: admitted),
    answered by the app's own exception handler (a ConveyorError's 401, Redis being down a
    503), as it would be from the route: those stand behind this middleware. An error with no
    handler of its own (a bug) is left to the server's, which logs it."""
    request = Request(scope)
    try:
        await authenticate_early(request)
    except Exception as exc:
        handlers = request.app.exception_handlers
        kind = next((k for k in type(exc).__mro__ if k in handlers and k is not Exception), None)
        if kind is None:
            raise
        response = handlers[kind](request, exc)
        return await response if inspect.isawaitable(response) else response
    return None


class HostAllowList:
    """With auth disabled every caller is the admin, and a web page whose own name resolves to
    this machine (DNS rebinding) is same-origin with the producer in the user's browser: only
    a Host naming loopback (`localhost`, `*.localhost`), an IP literal (no DNS, so no rebinding;
    a LAN address keeps working), the name the producer binds (CONVEYOR_HOST) or one of
    CONVEYOR_ALLOWED_HOSTS is served, any port. A request with no Host (HTTP/1.0) is served: a
    browser always sends one, so such a request is no page's. Each Host's answer is kept."""

    def __init__(self, names: Sequence[str]) -> None:
        domains = {name for name in names if name.startswith(".")} | {LOOPBACK_DOMAIN}
        self.domains = tuple(domains)
        # `.example.com` serves example.com itself too, as Django's ALLOWED_HOSTS does
        self.names = frozenset(names) | {domain[1:] for domain in domains}
        self.seen: dict[bytes, bool] = {}

    @classmethod
    def of(cls, settings: Settings) -> HostAllowList | None:
        """None where every Host is served: auth enabled (a rebinding page holds no key) or `*`."""
        if settings.auth != "disabled" or "*" in settings.allowed_hosts:
            return None
        return cls([*settings.allowed_hosts, settings.host.lower().rstrip(".")])

    def refused(self, scope: Scope) -> str | None:
        """The request's Host when it is not served, else None."""
        for key, value in scope["headers"]:
            if key == b"host" and not self.allows(value):
                return value.decode("latin-1")
        return None

    def allows(self, host: bytes) -> bool:
        if (known := self.seen.get(host)) is not None:
            return known
        if len(host) > HOST_MAX:
            return False  # no name is this long: refused, and not kept (uvicorn takes 64 kB)
        allowed = self._serves(host.decode("latin-1").strip().lower())
        if len(self.seen) >= HOSTS_KEPT:  # a new Host per request costs no more than this
            self.seen.clear()
        self.seen[host] = allowed
        return allowed

    def _serves(self, host: str) -> bool:
        if not host:
            return True  # an empty Host (a target without authority): no browser sends one
        if not (form := HOST_FORM.fullmatch(host)):
            return False
        name = form[1].rstrip(".")  # `localhost.`: the same name, fully qualified
        if name in self.names or name.endswith(self.domains):
            return True
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return True


class RequestBoundaryMiddleware:
    """Verifies the key of a request to a keyed route (else 401, its body unread), reads the
    whole body (up to its limit, else 413 before anything is parsed), checks a JSON body to a
    route (else 422) and leaves its value in the scope (`PARSED_JSON`), then replays the body to
    the app;
    later `receive` calls (disconnects) pass straight through. A POST to one of `uploads`
    (batch input: OpenAI's accept files of 200 MB and 50,000 lines) is held to `upload_limit`,
    any other body to `limit`, which a job's inputs need."""

    def __init__(
        self,
        app: ASGIApp,
        limit: BodyLimit,
        upload_limit: BodyLimit,
        uploads: frozenset[str],
        max_depth: int,
        own_format: frozenset[str],
        hosts: HostAllowList | None,
    ) -> None:
        self.app = app
        self.hosts = hosts  # None: every Host served
        self.limit = limit
        self.upload_limit = upload_limit
        self.uploads = uploads
        self.max_depth = max_depth
        self.own_format = own_format
        self.routes: list[tuple[BaseRoute, bool]] | None = None
        # (method, path) → whether its route takes a key (None: no route): a hot route's fixed
        # path (a submit, a completion) is matched against the routes once, not on every
        # request (4 µs a submit)
        self.keyed_paths: dict[tuple[str, str], bool | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.hosts is not None and (host := self.hosts.refused(scope)) is not None:
            await host_refused(host)(scope, receive, send)
            return
        # (method, path past the root path): what the routes' own paths are compared with
        at = (scope["method"], route_path(scope))
        keyed = self._keyed(scope, at)
        if keyed and (refusal := await _unauthenticated(scope)):
            await refusal(scope, receive, send)
            return
        # Read as Starlette reads them, so a body is checked whenever FastAPI will parse it: a
        # repeated header's first value (a dict kept the last, and `application/json` then
        # `text/plain` reached the route unchecked).
        headers = Headers(scope=scope)
        limit = self._limit_of(at)
        try:
            if _declares_over(headers.get("content-length", ""), limit.max_bytes):
                raise BodyTooLarge
            body = await _read(receive, limit.max_bytes)
        except BodyTooLarge:
            message = f"request body exceeds {limit.max_bytes} bytes ({limit.setting})"
            refusal = error_response(413, "payload_too_large", message, CLOSE)
            await refusal(scope, receive, send)
            return
        # a request no route takes is the router's 404 or 405, whatever its body holds
        if body and keyed is not None and (refusal := self._refusal(scope, at, headers, body)):
            await refusal(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(
        self, scope: Scope, at: tuple[str, str], headers: Headers, body: bytes
    ) -> Response | None:
        """The 415 of a body in a content coding, or the 422 of a JSON body Conveyor cannot
        store; None for a body the route may take, its JSON value left in the scope."""
        if coded := _content_coding(headers):
            message = (
                f"Content-Encoding {client_named(coded)} is not supported: send the body "
                "uncompressed (no Content-Encoding)"
            )
            return error_response(415, "unsupported_media_type", message, UNCODED)
        if _is_json(at, headers.get("content-type"), self.own_format):
            try:
                scope[PARSED_JSON] = parse_json(body, self.max_depth)
            except ValueError as exc:  # UnstorableJson, JSONDecodeError, UnicodeDecodeError
                return error_response(422, "invalid_request", f"body is not acceptable JSON: {exc}")
        return None

    def _keyed(self, scope: Scope, at: tuple[str, str]) -> bool | None:
        """Whether the route the router will pick for the request (the first whose path and
        method match) takes an API key; None where no route takes it. The app's routes are
        classed at its first request, when every router is included; the answers kept are
        forgotten past KEYED_PATHS_KEPT (paths holding ids are each new), and none is kept for
        a path past KEYED_PATH_MAX. Kept by `at`, (method, route path): the routes match that."""
        if at in self.keyed_paths:
            return self.keyed_paths[at]
        if self.routes is None:
            self.routes = [(route, keyed(route)) for route in scope["app"].routes]
        full = (keys for route, keys in self.routes if route.matches(scope)[0] is Match.FULL)
        found = next(full, None)
        if len(at[1]) <= KEYED_PATH_MAX:
            if len(self.keyed_paths) >= KEYED_PATHS_KEPT:
                self.keyed_paths.clear()
            self.keyed_paths[at] = found
        return found

    def _limit_of(self, at: tuple[str, str]) -> BodyLimit:
        upload = at[0] == "POST" and at[1] in self.uploads
        return self.upload_limit if upload else self.limit


def _declares_over(declared: str, max_bytes: int) -> bool:
    """Whether a Content-Length declares more than `max_bytes` (latin-1 text: "²" is a digit
    too). Compared as digits: Python reads no int of over 4,300 of them, and llhttp, uvicorn's
    parser, takes `000…01` of any length (a 5,000-digit length answered 500)."""
    if not (declared.isascii() and declared.isdigit()):
        return False
    digits, limit = declared.lstrip("0"), str(max_bytes)
    return (len(digits), digits) > (len(limit), limit)


async def _read(receive: Receive, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""  # the client left; the app will see the disconnect
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > max_bytes:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
