"""HTTP request count and latency by route template (never by raw path, which holds job ids)."""

from __future__ import annotations

import time
from functools import lru_cache

from prometheus_client.metrics import Counter, Histogram
from starlette.applications import Starlette
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.metrics import HTTP_LATENCY, HTTP_REQUESTS

# The methods the app serves; any other a client sends (the HTTP parser takes some 30: WebDAV's,
# PURGE, and TRACE and CONNECT, which no route takes) reads `other`, or each would be a series per
# route and status (a 405 needs no API key).
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))


@lru_cache(maxsize=4096)
def _series(method: str, route: str, status: int) -> tuple[Counter, Histogram]:
    """The request counter and latency histogram of one (method, route, status): found once,
    not per request (`labels` takes a lock and builds its key each time)."""
    return HTTP_REQUESTS.labels(method, route, str(status)), HTTP_LATENCY.labels(method, route)


def _route_of(scope: Scope) -> str:
    """The template of the route that answered; for a request refused before routing ran (the
    request boundary's 413 and 422), of the route it was for, so those are told apart by route.
    A path no route matches reads `unmatched` (the router's own 404 is not matched again)."""
    route = scope.get("route")
    if route is None and "router" not in scope:
        app: Starlette = scope["app"]
        route = next((r for r in app.routes if r.matches(scope)[0] is Match.FULL), None)
    return getattr(route, "path", "unmatched")


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            method = scope["method"] if scope["method"] in _METHODS else "other"
            requests, latency = _series(method, _route_of(scope), status)
            requests.inc()
            latency.observe(time.perf_counter() - started)
