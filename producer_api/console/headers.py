"""Security headers on every answer under /console: its pages, files and feeds, and every error,
whoever made it (the app's exception handlers, Starlette's router). A route class that added
them to its routes' answers and errors left out what the router answers before any route runs:
a 405 for a console route asked with another method, a 404 for a path it does not have. Nor
does a middleware see the safety net's 500 for a bug (Starlette answers it outside them all):
the console's are answered here. A strict Content-Security-Policy: scripts and styles only
from /console/static, no framing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer_api.route_path import route_path

PREFIX = "/console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_RAW = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]
_NAMES = {name for name, _ in _RAW}
SafetyNet = Callable[[Request, Exception], Awaitable[Response]]


def is_console(scope: Scope) -> bool:
    """Whether the request is the console's, its path read past the ASGI root_path, as the
    router reads it: uvicorn --root-path puts that before the path, which the console's
    answers under a prefix then went without their headers."""
    path = route_path(scope)
    return path == PREFIX or path.startswith(PREFIX + "/")


class ConsoleHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console(scope):
            await self.app(scope, receive, send)
            return

        started = False

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                own = [(n, v) for n, v in message.get("headers", ()) if n.lower() not in _NAMES]
                message = {**message, "headers": own + _RAW}
            await send(message)

        try:
            await self.app(scope, receive, send_secured)
        except Exception as exc:
            safety_net: SafetyNet | None = scope["app"].exception_handlers.get(Exception)
            if started or safety_net is None:
                raise
            # answered (and logged) once, here: raised on, the safety net ran again outside
            response = await safety_net(Request(scope), exc)
            await response(scope, receive, send_secured)
