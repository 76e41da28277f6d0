"""RateLimit-* headers on every answer to a rate-limited key, not only on its 429: a client
paces itself by `RateLimit-Remaining` before it is refused, as OpenAI's and GitHub's APIs let it
(draft-ietf-httpapi-ratelimit-headers). The auth dependency keeps the bucket's state in the
request's scope; this middleware writes it into the response's head, whatever the route
returned (a Response of its own, a stream)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.rate_limit import BucketState

SCOPE_KEY = "conveyor.rate_limit"


def keep(scope: Scope, bucket: BucketState) -> None:
    """The bucket's state after this request's take, for its answer's head."""
    scope[SCOPE_KEY] = [(k.lower().encode(), v.encode()) for k, v in bucket.headers().items()]


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
