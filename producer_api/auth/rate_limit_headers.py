"""Headers on every answer to a keyed request, whatever the route returned (a Response of its
own, a stream): `Cache-Control: no-store`, since what a key is answered is its tenant's, and a
shared cache keyed by URL alone (Varnish's default heeds `Authorization`, not `X-API-Key`)
would serve one tenant's `GET /v1/files` to the next; and, for a rate-limited key, RateLimit-* on
every answer, not only on its 429: a client paces itself by `RateLimit-Remaining` before it is
refused, as OpenAI's and GitHub's APIs let it (draft-ietf-httpapi-ratelimit-headers). The auth
dependency keeps them in the request's scope; this middleware writes them into the response's
head, each unless the route set its own."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.rate_limit import BucketState

SCOPE_KEY = "conveyor.rate_limit"
PRIVATE = {"Cache-Control": "no-store"}


def keep(scope: Scope, bucket: BucketState | None) -> None:
    """The keyed answer's headers: no-store, and the bucket's state after this request's take
    (None: a key without a quota), for its answer's head."""
    headers = PRIVATE | (bucket.headers() if bucket is not None else {})
    scope[SCOPE_KEY] = [(k.lower().encode(), v.encode()) for k, v in headers.items()]


class RateLimitHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start" and (kept := scope.get(SCOPE_KEY)):
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in kept if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_limits)
