"""The one edge every request body crosses before a route sees it: a request to a route that takes
an API key has its key verified first (401 whatever its body: `authenticate_early`), bodies are
bounded (413, declared or chunked; batch input by its own, larger bound), sent as they are (415
for one in a `Content-Encoding`: none is decoded), and a JSON body must hold only what Conveyor
can store and serialise — valid Unicode (no lone surrogates), integers within 64 bits, finite
numbers, at most `CONVEYOR_MAX_JSON_DEPTH` levels of nesting — anywhere, free-form `inputs` and
`parameters` included (422). Checking here, once, means nothing deeper (orjson, pydantic, Redis)
ever meets a value it would fail on."""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from email.message import Message as MimeHeader
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.auth.dependencies import authenticate_early, keyed
from producer_api.errors import error_response

# The most (method, path) answers `RequestBoundaryMiddleware._keyed` keeps.
KEYED_PATHS_KEPT = 4096
# What orjson serialises: signed and unsigned 64-bit integers.
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# Where the parsed body waits for the route (an ASGI scope key), so it is parsed once.
PARSED_JSON = "conveyor.parsed_json"
NOT_PARSED = object()
# What a 415 for a body in a content coding names as taken (RFC 9110 12.5.3): the body as is.
UNCODED = {"Accept-Encoding": "identity"}


class BodyTooLarge(Exception):
    pass


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """The most bytes a body may hold, and the variable that sets it (named in the 413)."""

    max_bytes: int
    setting: str


class UnstorableJson(ValueError):
    """A JSON body that parses but holds a value Conveyor cannot store."""


def _checked_int(text: str) -> int:
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise UnstorableJson(f"integer {text[:24]}... does not fit in 64 bits")
    return value


def _checked_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnstorableJson(f"number {text[:24]} is not finite")
    return value


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


def check_value(value: Any, max_depth: int) -> bool:
    """Raise UnstorableJson when a parsed JSON value nests deeper than `max_depth` or holds a
    string (keys too) that is not valid Unicode. Iterative, so depth costs no recursion. True
    when it holds a float beyond 64-bit integers: orjson reads an oversized integer as one."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    huge = False
    while pending:
        item, path = pending.pop()
        if isinstance(item, str):
            _check_text(item, path)
            continue
        if isinstance(item, float):
            huge = huge or abs(item) >= -INT_MIN
            continue
        if not isinstance(item, dict | list):
            continue
        if len(path) >= max_depth:
            raise UnstorableJson(f"{_where(path)}: nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, path)
                pending.append((child, (*path, key)))
        else:
            pending.extend((child, (*path, index)) for index, child in enumerate(item))
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
        value = json.loads(
            body,
            parse_int=_checked_int,
            parse_float=_checked_float,
            parse_constant=_no_constant,
        )
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


def _is_json(scope: Scope, raw: str | None, own_format: frozenset[str]) -> bool:
    """As FastAPI decides from the content type `raw`: none, `application/json` or
    `application/*+json`; routes in `own_format` (JSONL uploads) parse and check their bodies
    themselves, line by line."""
    if scope["path"] in own_format and scope["method"] == "POST":
        return False
    if raw is None or raw == "application/json":
        return True
    header = MimeHeader()
    header["content-type"] = raw
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


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


class RequestBoundaryMiddleware:
    """Verifies the key of a request to a keyed route (else 401, its body unread), reads the
    whole body (up to its limit, else 413 before anything is parsed), checks a JSON body (else
    422) and leaves its value in the scope (`PARSED_JSON`), then replays the body to the app;
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
    ) -> None:
        self.app = app
        self.limit = limit
        self.upload_limit = upload_limit
        self.uploads = uploads
        self.max_depth = max_depth
        self.own_format = own_format
        self.routes: list[tuple[BaseRoute, bool]] | None = None
        # (method, path) → whether its route takes a key: a hot route's fixed path (a submit, a
        # completion) is matched against the routes once, not on every request (4 µs a submit)
        self.keyed_paths: dict[tuple[str, str], bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._keyed(scope) and (refusal := await _unauthenticated(scope)):
            await refusal(scope, receive, send)
            return
        # Read as Starlette reads them, so a body is checked whenever FastAPI will parse it: a
        # repeated header's first value (a dict kept the last, and `application/json` then
        # `text/plain` reached the route unchecked).
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")  # latin-1 text: "²" is a digit too
        limit = self._limit_of(scope)
        try:
            if declared.isascii() and declared.isdigit() and int(declared) > limit.max_bytes:
                raise BodyTooLarge
            body = await _read(receive, limit.max_bytes)
        except BodyTooLarge:
            message = f"request body exceeds {limit.max_bytes} bytes ({limit.setting})"
            await error_response(413, "payload_too_large", message)(scope, receive, send)
            return
        if body and (coded := _content_coding(headers)):
            message = (
                f"Content-Encoding {coded} is not supported: send the body uncompressed "
                "(no Content-Encoding)"
            )
            refusal = error_response(415, "unsupported_media_type", message, UNCODED)
            await refusal(scope, receive, send)
            return
        if body and _is_json(scope, headers.get("content-type"), self.own_format):
            try:
                scope[PARSED_JSON] = parse_json(body, self.max_depth)
            except ValueError as exc:  # UnstorableJson, JSONDecodeError, UnicodeDecodeError
                message = f"body is not acceptable JSON: {exc}"
                await error_response(422, "invalid_request", message)(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)

    def _keyed(self, scope: Scope) -> bool:
        """Whether the route the router will pick for the request (the first whose path and
        method match) takes an API key. The app's routes are classed at its first request, when
        every router is included; the answers kept are forgotten past KEYED_PATHS_KEPT (paths
        holding ids are each new)."""
        at = (scope["method"], scope["path"])
        if (known := self.keyed_paths.get(at)) is not None:
            return known
        if self.routes is None:
            self.routes = [(route, keyed(route)) for route in scope["app"].routes]
        full = (keys for route, keys in self.routes if route.matches(scope)[0] is Match.FULL)
        if len(self.keyed_paths) >= KEYED_PATHS_KEPT:
            self.keyed_paths.clear()
        self.keyed_paths[at] = found = next(full, False)
        return found

    def _limit_of(self, scope: Scope) -> BodyLimit:
        upload = scope["method"] == "POST" and scope["path"] in self.uploads
        return self.upload_limit if upload else self.limit


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
