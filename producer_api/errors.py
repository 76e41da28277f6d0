"""Every error leaves as `{"error": {"type", "message"}}` with the right status; nothing a client
sends turns into a 500, and Redis being down is a 503 with Retry-After, not a crash."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine
from email.message import Message as MimeHeader
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from redis.exceptions import MasterDownError, OutOfMemoryError, ReadOnlyError
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

from producer_api.openai import OPENAI_PATHS
from producer_api.responses import FastJSONResponse
from producer_api.route_path import route_path
from shared.model_repository import QUOTED_CHARS, client_named, quote
from shared.problem_list import listed
from shared.redis_client import OUT_OF_REACH, PersistenceError, ReplicasMissing, ScriptBusy

log = logging.getLogger(__name__)
# Statuses whose retry repeats the outcome or does the work again, unless the error says when
# to retry (Retry-After: a conflict that passes): a 409 (a cancelled job, a request that
# conflicts with one made before), a 502 (a model's outputs not of the route's shape). OpenAI's
# SDKs retry 409 and every 5xx unless the response says not to: each retry of a route that
# runs a job was another job, a cancelled one's cancel undone.
NO_RETRY = {"x-should-retry": "false"}
NOT_RETRIED = frozenset({409, 502})
FULL_RETRY_S = 5  # Retry-After while Redis is out of memory or cannot persist
FAILING_OVER = "the queue's Redis is a replica for now (a failover?); retry shortly"
# A Redis that refuses writes for a while, a state of the server and not an error of the
# request: what the 503 says, and its Retry-After in seconds. A replica where the master was (a
# failover behind one address; the client has retried on new connections already, the next
# request may reach the new master); one at its maxmemory (results expire, memory is added);
# one that could not persist (a full or lost disk, which an operator mends), or whose replicas
# are too few for its min-replicas-to-write; one running a script past its time limit.
REFUSALS: dict[type[Exception], tuple[str, int]] = {
    ReadOnlyError: (FAILING_OVER, 1),
    MasterDownError: (FAILING_OVER, 1),
    OutOfMemoryError: (
        "the queue's Redis is out of memory (its maxmemory); retry later",
        FULL_RETRY_S,
    ),
    PersistenceError: (
        "the queue's Redis cannot write to its disk (MISCONF); retry later",
        FULL_RETRY_S,
    ),
    ReplicasMissing: (
        "the queue's Redis has too few replicas to take writes (NOREPLICAS); retry later",
        FULL_RETRY_S,
    ),
    ScriptBusy: ("the queue's Redis is busy running a script (BUSY); retry shortly", 1),
}


class ErrorDetail(BaseModel):
    type: str
    message: str
    request_id: str | None = None  # only on `internal` errors: what to quote to the operator
    # only on `deadline_unmeetable`: the ETA (ms until it would start) the job would have had
    eta_ms: int | None = None


class ErrorBody(BaseModel):
    """The body of every error response, declared so the OpenAPI documents (and schema-checked
    clients and fuzzers can verify) what an error looks like."""

    error: ErrorDetail


class OpenAIErrorDetail(BaseModel):
    # Conveyor's own fields of an error (`job`, `request_id`, `eta_ms`) ride along
    model_config = ConfigDict(extra="allow")

    message: str
    type: str
    param: str | None = None  # the field refused, where the refusal names one
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """An error on one of OpenAI's routes, as OpenAI's API answers it: an invalid request (a
    400; an unknown model's 404, `code` model_not_found) `invalid_request_error`, any other
    Conveyor's type with OpenAI's `code` where OpenAI's API has one (`OPENAI_CODES`)."""

    error: OpenAIErrorDetail


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for error statuses, each with its description and the error body."""
    return {code: {"model": ErrorBody, "description": text} for code, text in descriptions.items()}


class ConveyorError(Exception):
    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers
        self.details = details  # more ErrorDetail fields, e.g. `eta_ms`
        self.param = param  # the field refused: OpenAI's `param` (see `error_response`)
        self.code = code  # OpenAI's `code` for an error its API answers too (`_as_openai`)

    def as_openai(self) -> OpenAIErrorBody:
        """This error's body in OpenAI's shape (`_as_openai`): what a stream, its status sent
        already, ends with."""
        openai = _as_openai(
            self.status, self.type, self.message, self.param, self.code, self.details
        )
        return openai[1]


def unknown_model(model: str) -> ConveyorError:
    """A model the repository does not have: OpenAI's routes answer it as OpenAI's API does
    (404 `model_not_found`: its SDK users read `e.code`), Conveyor's in Conveyor's shape. A
    long name is quoted cut short, as every refused value is."""
    shown = repr(model) if len(model) <= QUOTED_CHARS else quote(model)
    return ConveyorError(
        404, "not_found", f"model {shown} not found", param="model", code="model_not_found"
    )


def unauthorized(message: str, presented: bool = True) -> ConveyorError:
    """RFC 6750's challenge: `invalid_token` for a key that was presented and refused (unknown,
    revoked, expired: at the request's door or found so while it waited), no error code for a
    request that presented none."""
    challenge = 'Bearer error="invalid_token"' if presented else "Bearer"
    return ConveyorError(401, "unauthorized", message, {"WWW-Authenticate": challenge})


# The request state's flag that its refusals answer in OpenAI's shape (`answer_as_openai`).
OPENAI_ERRORS = "openai_errors"


def mark_as_openai(request: Request) -> None:
    """Mark a request OpenAI's SDKs send to a route whose path alone does not say so (the Files
    API, the Batch API's reads, and a batch create whose body is OpenAI's): its invalid request
    answers OpenAI's 400 (`ErrorResponse`)."""
    setattr(request.state, OPENAI_ERRORS, True)


async def answer_as_openai(request: Request) -> None:
    """`mark_as_openai` as a route dependency, which runs before FastAPI refuses the route's
    parameters (async: a sync dependency runs on a thread of the pool, a hop per request)."""
    mark_as_openai(request)


class OpenAIRoute(APIRoute):
    """A route all of whose requests are OpenAI's, marked before FastAPI reads the body: a form
    is parsed before any dependency runs, so `answer_as_openai` came too late for a multipart
    body that does not parse."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def marked(request: Request) -> Response:
            mark_as_openai(request)
            return await handler(request)

        return marked


OPENAI_BASE = "/v1/"  # OpenAI's SDKs' base URL, where an unknown route answers in OpenAI's shape


def _openai_request(scope: Scope) -> bool:
    if route_path(scope) in OPENAI_PATHS or scope.get("state", {}).get(OPENAI_ERRORS):
        return True
    # refused before routing (the boundary's 401 or 413): by the route that would have run
    return "endpoint" not in scope and "app" in scope and _openai_match(scope) is Match.FULL


def _openai_match(scope: Scope) -> Match:
    """How the request matches a route that marks its requests OpenAI's, in one walk of the
    app's routes: FULL where the route its path and method name (the first full match) marks
    them, PARTIAL where none takes it and one on its path does (another method), else NONE."""
    found = Match.NONE
    for route in scope["app"].router.routes:
        match = route.matches(scope)[0]
        if match is Match.FULL:
            return Match.FULL if _marks_openai(route) else Match.NONE
        if match is Match.PARTIAL and _marks_openai(route):
            found = Match.PARTIAL
    return found


def _marks_openai(route: BaseRoute) -> bool:
    return isinstance(route, OpenAIRoute) or any(
        depends.dependency is answer_as_openai for depends in getattr(route, "dependencies", ())
    )


class ErrorResponse(FastJSONResponse):
    """An error, in the shape of the route it answers, chosen as it is sent (from the request's
    path: the request boundary refuses a body before any route is matched; or as its route
    marked it, `answer_as_openai`): `openai` makes its status and body in OpenAI's shape
    (`_as_openai`), only for a request of OpenAI's: every other error (a 429 under load among
    them) built a body it never sent."""

    def __init__(
        self,
        body: dict[str, Any],
        status: int,
        headers: dict[str, str] | None,
        openai: Callable[[], tuple[int, OpenAIErrorBody]],
    ) -> None:
        super().__init__(body, status_code=status, headers=headers)
        self.openai = openai
        self.given_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _openai_request(scope):
            await super().__call__(scope, receive, send)
            return
        status, body = self.openai()
        await FastJSONResponse(body.model_dump(), status, self.given_headers)(scope, receive, send)


# OpenAI's documented `code` of the errors its API answers too, by Conveyor's type: its SDKs'
# users read `e.code` (a 401's `invalid_api_key`, a 429's `rate_limit_exceeded`).
OPENAI_CODES = {
    "unauthorized": "invalid_api_key",
    "rate_limited": "rate_limit_exceeded",
    "insufficient_quota": "insufficient_quota",
}


def _as_openai(
    status: int,
    type_: str,
    message: str,
    param: str | None,
    code: str | None,
    details: dict[str, Any] | None = None,
) -> tuple[int, OpenAIErrorBody]:
    """An error as OpenAI's API and vLLM's server answer it: OpenAI's SDKs read `message`,
    `type`, `param` and `code` of every error they get. An invalid request is a 400
    `invalid_request_error`: OpenAI's SDKs raise BadRequestError for it (a 422 raised
    UnprocessableEntityError, which no OpenAI client expects of a bad request); so is an error
    with OpenAI's `code` (`unknown_model`), or naming the field it refuses (a batch's unknown
    `input_file_id`), which keeps its status. Any other keeps Conveyor's type, as a stream's
    error chunk does, with OpenAI's code where it has one (`OPENAI_CODES`)."""
    openai_type = "invalid_request_error"
    if type_ == "invalid_request" and status in (400, 422):
        status = 400
    elif code is None and param is None:
        openai_type, code = type_, OPENAI_CODES.get(type_)
    fields = {"message": message, "type": openai_type, "param": param, "code": code}
    detail = OpenAIErrorDetail(**{**(details or {}), **fields})
    return status, OpenAIErrorBody(error=detail)


def error_response(
    status: int,
    type_: str,
    message: str,
    headers: dict[str, str] | None = None,
    details: dict[str, Any] | None = None,
    param: str | None = None,
    code: str | None = None,
) -> ErrorResponse:
    """The error's response; `param` (the field an invalid request was refused for) and `code`
    only OpenAI's shape carries."""
    body = {"error": {"type": type_, "message": message, **(details or {})}}
    if status in NOT_RETRIED and "Retry-After" not in (headers or {}):
        headers = {**NO_RETRY, **(headers or {})}
    openai = partial(_as_openai, status, type_, message, param, code, details)
    return ErrorResponse(body, status, headers, openai)


def host_refused(host: str) -> ErrorResponse:
    """The 400 of a request whose Host the producer does not serve with auth disabled
    (request_boundary.HostAllowList): a DNS-rebinding page's, whose own name now points at
    this machine."""
    message = (
        f"Host {quote(host)} is not served: with CONVEYOR_AUTH=disabled only localhost, IP "
        "addresses, CONVEYOR_HOST and the names in CONVEYOR_ALLOWED_HOSTS are"
    )
    return error_response(400, "invalid_host", message)


def _refused_field(exc: RequestValidationError) -> str | None:
    """The field the first error names, as the client named it (OpenAI's `param`): without its
    place (`body`, `query`, `path`), as OpenAI names a query's `limit`."""
    errors = exc.errors()
    field = errors[0].get("loc", ())[1:] if errors else ()
    return ".".join(map(client_named, field)) or None


def _where(err: Any) -> str:
    """Where in the request an error is, as the client named it; empty for the whole body."""
    return ".".join(client_named(p) for p in err.get("loc", ()) if p != "body")


def read_as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON: `application/json` or
    `application/*+json`, whatever its parameters. A body with none it does not read so (its
    strict content type), nor a `text/json` one."""
    if content_type == "application/json":
        return True
    if not content_type:
        return False
    header = MimeHeader()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _validation_message(request: Request, exc: RequestValidationError) -> str:
    content_type = request.headers.get("content-type")
    if _whole_body_refused(exc) and not read_as_json(content_type):
        media_type = (content_type or "").split(";")[0].strip().lower()
        # curl's -d without -H sends application/x-www-form-urlencoded: the JSON is never read
        return (
            "body: send a JSON object with Content-Type: application/json (this request's is "
            f"{client_named(media_type or 'missing')}; "
            "curl needs -H 'Content-Type: application/json')"
        )
    return listed([f"{_where(err) or 'body'}: {err.get('msg', 'invalid')}" for err in exc.errors()])


def _whole_body_refused(exc: RequestValidationError) -> bool:
    """The body as a whole was not an object: what FastAPI makes of a body it did not read as
    JSON, whatever it held."""
    return any(tuple(err.get("loc", ())) == ("body",) for err in exc.errors())


def _allowed_methods(request: Request) -> str:
    """Every method the request's path takes, as a 405's Allow must list them (RFC 9110
    15.5.6): FastAPI makes a route of each method, and Starlette's 405 names only the methods
    of the first route whose path matched. HEAD wherever GET is: every GET route answers it
    (app.HeadAsGet), though none names it. Empty where no route names its methods (the 405's
    own Allow stands)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def _slash_twin(request: Request) -> str | None:
    """Where a request no route took is answered, its path's trailing slash added or dropped,
    as a relative reference (RFC 9110 10.2.2) to its last segment; None where no route takes
    that path either. Starlette's own redirect built an absolute URL from the request's scheme
    and Host: behind a proxy that ends TLS it sent clients to `http://`, and it echoed whatever
    Host the client named; a path-absolute one led out of the prefix a proxy in front strips."""
    path = request.scope["path"]
    # `//`: no one slash away from a route, and a relative reference past an empty segment
    # resolves differently in Python's urljoin (requests follows redirects with it) than in
    # browsers
    if "endpoint" in request.scope or route_path(request.scope) == "/" or path.endswith("//"):
        return None
    twin = {**request.scope, "path": _toggled_slash(path)}
    if all(route.matches(twin)[0] is Match.NONE for route in request.app.router.routes):
        return None
    sent = request.scope.get("raw_path") or path.encode()  # as the client encoded it
    query = request.scope.get("query_string", b"")
    return _relative_twin(sent.decode("latin-1")) + (f"?{query.decode('latin-1')}" if query else "")


def _relative_twin(sent: str) -> str:
    """`sent`'s slash twin relative to `sent` itself: `/v1/models/` → `../models`, `/v1/jobs`
    → `./jobs/` (`./`: a segment with a `:` is no scheme)."""
    if sent.endswith("/"):
        return f"../{sent[:-1].rsplit('/', 1)[-1]}"
    return f"./{sent.rsplit('/', 1)[-1]}/"


def _unrouted_openai(request: Request) -> bool:
    """A request no route took under OpenAI's base URL: most likely one of OpenAI's APIs that
    Conveyor lacks (`/v1/responses`), its SDK reading the 404 in OpenAI's shape."""
    return "endpoint" not in request.scope and route_path(request.scope).startswith(OPENAI_BASE)


def _toggled_slash(path: str) -> str:
    return path.rstrip("/") if path.endswith("/") else f"{path}/"


def _without_fastapis_422(documented: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The OpenAPI document without FastAPI's own 422 body (HTTPValidationError), which no
    route answers (`_invalid` does, in ErrorBody's or OpenAI's shape): FastAPI adds it to a route
    that declares no 422 of its own, as the Files API's, whose invalid requests are OpenAI's 400,
    and an SDK generated from the document expected a body that never comes."""

    def openapi() -> dict[str, Any]:
        schema = documented()  # FastAPI's, made once and kept: this edits it once
        for operations in schema["paths"].values():
            for operation in operations.values():
                if "HTTPValidationError" in str(operation["responses"].get("422", "")):
                    del operation["responses"]["422"]
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        return schema

    return openapi


def install_error_handlers(app: FastAPI) -> None:
    app.openapi = _without_fastapis_422(app.openapi)  # type: ignore[method-assign]

    @app.exception_handler(ConveyorError)
    async def _conveyor(_: Request, exc: ConveyorError) -> ErrorResponse:
        return error_response(
            exc.status, exc.type, exc.message, exc.headers, exc.details, exc.param, exc.code
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> ErrorResponse:
        message = _validation_message(request, exc)
        return error_response(422, "invalid_request", message, param=_refused_field(exc))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404 and (twin := _slash_twin(request)):
            return RedirectResponse(twin, 307)
        if exc.status_code == 404 and _unrouted_openai(request):
            mark_as_openai(request)
        # a 405 on a path one of OpenAI's routes takes with another method (`PUT /v1/files`):
        # its route never ran to mark the request, and OpenAI's SDK read no `e.code` of ours
        if exc.status_code == 405 and _openai_match(request.scope) is Match.PARTIAL:
            mark_as_openai(request)
        # a 400: a body that does not parse (a multipart form), an invalid request
        type_ = {400: "invalid_request", 404: "not_found"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405 and (allowed := _allowed_methods(request)):
            headers = {**(headers or {}), "Allow": allowed}
        return error_response(exc.status_code, type_, str(exc.detail), headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> ErrorResponse:
        """The safety net: a bug still answers in the documented shape, and its traceback is
        logged under an id the client can quote."""
        request_id = uuid.uuid4().hex
        log.error(
            "unhandled error on %s %s (request %s)",
            request.method,
            request.url.path,
            request_id,
            exc_info=exc,
            extra={"request_id": request_id},
        )
        message = f"internal error; quote request id {request_id}"
        headers = {"X-Request-ID": request_id}
        return error_response(500, "internal", message, headers, {"request_id": request_id})

    async def _redis_down(_: Request, exc: Exception) -> FastJSONResponse:
        log.warning("redis unavailable: %r", exc)
        return error_response(
            503, "unavailable", "the queue is unreachable; retry shortly", {"Retry-After": "1"}
        )

    async def _redis_refusing(_: Request, exc: Exception) -> FastJSONResponse:
        message, retry_s = next(said for kind, said in REFUSALS.items() if isinstance(exc, kind))
        log.warning("redis refuses writes: %s", exc)
        return error_response(503, "unavailable", message, {"Retry-After": str(retry_s)})

    for unreachable in OUT_OF_REACH:
        app.add_exception_handler(unreachable, _redis_down)
    for refusal in REFUSALS:
        app.add_exception_handler(refusal, _redis_refusing)
