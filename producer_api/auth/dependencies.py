"""`require(scope)`: the FastAPI dependency that guards a route. It reads the key from
`Authorization: Bearer` or `X-API-Key`, verifies it (401), takes a token from the key's bucket
(429 with Retry-After; RateLimit-* headers on every answer), checks the scope (403) and
returns the caller's Principal. The request boundary verifies the key of a request to such a
route and takes its token before its body is read (`authenticate_early`), and the dependency
takes the principal it found. With CONVEYOR_AUTH=disabled every caller is the anonymous
principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import cache
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Security
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import BaseRoute

from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.auth.rate_limit_headers import keep
from producer_api.errors import ConveyorError, ErrorBody, unauthorized
from producer_api.state import ProducerState, producer_state
from shared.api_key_scopes import Scope
from shared.api_keys import ApiKey
from shared.rate_limit import BucketState
from shared.redis_clock import CLOCK

_BEARER = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`")
_HEADER = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key")

Service = TypeVar("Service")
# Where `authenticate_early` leaves the caller (an ASGI scope key) for the route's dependency,
# so a request's key is read from Redis once.
PRINCIPAL = "conveyor.principal"

AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing, unknown, expired or revoked API key"},
    403: {"model": ErrorBody, "description": "The key lacks the scope or the model"},
    429: {"model": ErrorBody, "description": "Rate limited or too many jobs in flight"},
}


def _presented(bearer: HTTPAuthorizationCredentials | None, header: str | None) -> str | None:
    return bearer.credentials if bearer is not None else header


async def authenticate(state: ProducerState, presented: str | None) -> Principal:
    if state.settings.auth == "disabled":
        return ANONYMOUS
    if not presented:
        message = "an API key is required: `Authorization: Bearer <key>` or X-API-Key"
        raise unauthorized(message, presented=False)
    return admit_key(state, await state.api_keys.verify(presented))


def admit_key(state: ProducerState, key: ApiKey | None) -> Principal:
    """The principal of a key read by the secret presented (None: no key has it), or the 401
    that refuses it: unknown, revoked or expired."""
    if key is None:
        raise unauthorized("unknown API key")
    if reason := key.refusal(CLOCK.now()):
        raise unauthorized(reason)
    return Principal.of(key, state.settings)


def keyed(route: BaseRoute) -> bool:
    """Whether `route` takes an API key: one of its dependencies reads the bearer token."""
    return isinstance(route, APIRoute) and any(call is _BEARER for call in _calls(route.dependant))


def _calls(dependant: Dependant) -> Iterator[Any]:
    """What each of a route's dependencies calls, those of its dependencies included."""
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


async def authenticate_early(request: Request) -> None:
    """Verify the key of a request to a keyed route before anything reads its body (the request
    boundary): a caller without a valid key is answered 401 whatever its body holds, as OpenAI's
    API, Triton and vLLM answer it, and learns nothing of how a body is validated (JSON that did
    not parse was a 422 first). Its token is taken here too: taken by the route, a key at its
    limit still had every body read and parsed (1 MiB of JSON, 100 MiB of upload) before its
    429, and a body the boundary refused was never counted. The principal waits in the scope
    for `admitted`."""
    state: ProducerState = request.app.state.conveyor
    presented = _presented(await _BEARER(request), await _HEADER(request))
    principal = await authenticate(state, presented)
    request.scope[PRINCIPAL] = principal
    await charge(state, request, principal)


async def throttle(state: ProducerState, principal: Principal) -> BucketState | None:
    """One token per request from the key's bucket, shared by every producer replica; the
    bucket after it (None for a key without a quota)."""
    if principal.quota is None:
        return None
    bucket = await state.rate_limiter.take(principal.limits_id, principal.quota)
    if not bucket.allowed:
        message = (
            f"rate limit of {principal.quota.rate_per_s:g}/s (burst {principal.quota.burst})"
            f" reached; retry in {bucket.retry_after_s}s"
        )
        raise ConveyorError(429, "rate_limited", message, bucket.headers())
    return bucket


async def charge(state: ProducerState, request: Request, principal: Principal) -> None:
    """Take the request's token and keep its answer's headers: no-store from the key check on,
    its 403 and 429 too (a shared cache keeping error answers by URL served one tenant's
    refusal to the next), then the bucket after the take."""
    keep(request.scope, None)
    keep(request.scope, await throttle(state, principal))


async def admitted(
    state: ProducerState,
    request: Request,
    bearer: HTTPAuthorizationCredentials | None,
    header: str | None,
    scope: Scope,
) -> Principal:
    """The caller, once its key is verified (401), got a token from its bucket (429) and holds
    `scope` (403); its answer's head then carries no-store and the bucket's state."""
    principal: Principal | None = request.scope.get(PRINCIPAL)
    if principal is None:  # a request the boundary did not see
        principal = await authenticate(state, _presented(bearer, header))
        await charge(state, request, principal)
    if not principal.may(scope):
        raise ConveyorError(403, "forbidden", f"this API key lacks the {scope!r} scope")
    return principal


@cache
def require(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """The dependency for routes that need `scope`; cached, so each scope is one dependency
    and FastAPI resolves it once per request however many parameters use it."""

    async def dependency(
        state: Annotated[ProducerState, Depends(producer_state)],
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
        header: Annotated[str | None, Security(_HEADER)],
    ) -> Principal:
        return await admitted(state, request, bearer, header, scope)

    dependency.__name__ = f"require_{scope}"
    return dependency


def acting_for(
    scope: Scope, service: Callable[[ProducerState, Principal], Service]
) -> Callable[..., Awaitable[Service]]:
    """The dependency that hands a route its service, built for a caller holding `scope`:
    `Annotated[JobsService, Depends(acting_for("read", JobsService))]`. It checks the key
    itself rather than through `require(scope)`: a level of FastAPI's dependency solving less
    on every request of the hot routes (so a route takes one of the two, never both)."""

    async def dependency(
        state: Annotated[ProducerState, Depends(producer_state)],
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
        header: Annotated[str | None, Security(_HEADER)],
    ) -> Service:
        return service(state, await admitted(state, request, bearer, header, scope))

    return dependency
