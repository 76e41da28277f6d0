"""HTTP routes of the jobs resource: parse, call JobsService, return."""

from __future__ import annotations

import re
from collections.abc import Coroutine
from typing import Annotated, Any, TypeGuard

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BeforeValidator
from starlette.responses import Response

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.client_disconnect import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnected,
    unless_disconnected,
)
from producer_api.errors import ConveyorError, error_responses
from producer_api.jobs.orjson_route import OrjsonRoute
from producer_api.jobs.protocol import JobAccepted, JobRequest, JobView, PredictRequest
from producer_api.jobs.serving import UNSUCCESSFUL_DESCRIPTIONS, JobsService, unsuccessful
from producer_api.responses import FastJSONResponse
from shared.job_states import JobStatus
from shared.model_names import NAME
from shared.queue_eta import STANDING_FIELDS
from shared.settings import Settings

router = APIRouter(tags=["jobs"], route_class=OrjsonRoute)
# No length bound: an id of any length not shaped as one is an unknown job (404, as
# `serving.checked_id` answers it), never a 422 about the path.
JOB_ID = Path(description="Job id")
# An Idempotency-Key: printable ASCII without spaces, 1 to KEY_MAX characters.
KEY_CHARS, KEY_MAX = r"[\x21-\x7e]", 255
_KEY = re.compile(f"{KEY_CHARS}{{1,{KEY_MAX}}}")
# The header as OpenAPI shows it on every route that takes one (`openapi_extra`): each reads it
# through `idempotency_key`, so each refuses a malformed key alike.
KEY_PARAMETER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": KEY_MAX,
        "pattern": f"^{KEY_CHARS}+$",
    },
}
# A 202's headers as OpenAPI shows them: `Location`, the accepted job's (or batch's) URL.
LOCATED = {"Location": {"description": "Its URL, to poll", "schema": {"type": "string"}}}
WAIT = Query(
    default=0.0,
    ge=0,
    le=600,
    allow_inf_nan=False,
    description="Seconds to wait for a terminal state",
)


def _true_or_false(value: object) -> object:
    """Only `true` or `false`: a lax `yes` or `1` is refused (422) rather than guessed at."""
    if value not in ("true", "false", True, False):
        raise ValueError("must be true or false")
    return value


ATTEMPTS = Annotated[
    bool,
    BeforeValidator(_true_or_false),
    Query(description="Include the job's `attempt_history`: true or false"),
]


SubmitService = Annotated[JobsService, Depends(acting_for("submit", JobsService))]
ReadService = Annotated[JobsService, Depends(acting_for("read", JobsService))]

_DESCRIPTIONS = {
    404: "Unknown model, variant or job",
    409: "Idempotency-Key reused with another body, or its first request still being enqueued "
    "after 5 s (Retry-After), or job already ended",
    413: "Body too large",
    415: "Body in a Content-Encoding (none is decoded): send it uncompressed",
    422: "Invalid request, or a body that is not acceptable JSON",
    429: "Partition full, rate limited, too many jobs in flight, or the deadline cannot be met"
    " (`deadline_unmeetable`, with the `eta_ms` it would have had); see Retry-After",
    503: "Queue unreachable",
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    **error_responses(_DESCRIPTIONS),
}
_PREDICT_ERRORS = {**_ERRORS, **error_responses(UNSUCCESSFUL_DESCRIPTIONS)}


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key, held to what `KEY_PARAMETER` documents. Read here, not
    declared: FastAPI's header parameter cost every request of the route ~20 us (measured on
    its `request_params_to_args`), this lookup ~2 us. Every route that takes the key reads it
    here, so a malformed one is refused with one message wherever it is sent."""
    key = request.headers.get("idempotency-key")
    if key is not None and not _KEY.fullmatch(key):
        message = f"Idempotency-Key: 1 to {KEY_MAX} printable ASCII characters, no spaces"
        raise ConveyorError(422, "invalid_request", message)
    return key


def link_base(request: Request) -> str:
    """The base of every link the producer hands out: CONVEYOR_PUBLIC_URL, else the request's
    own (scheme, Host and root path, as `url_for` builds on), which any client or proxy in front
    chooses. The settings are the app's, loaded once; `base_url` is built only when unset."""
    settings: Settings = request.app.state.settings
    return settings.public_url or str(request.base_url).rstrip("/")


def _accepted(
    request: Request,
    job_id: str,
    status: str,
    model: str,
    variant: str,
    standing: dict[str, Any],
) -> FastJSONResponse:
    """The 202 of a job not ended yet; `Location` names where to poll it, as an asynchronous
    request-reply API's 202 does for clients that follow it rather than read the body."""
    # What `url_for("get_job")` gives, without its scan of every route on each submit.
    base = f"{link_base(request)}/v1/jobs/{job_id}"
    body = {
        "id": job_id,
        "status": status,
        "model": model,
        "variant": variant,
        "urls": {"self": base, "events": f"{base}/events"},
        **standing,
    }
    return FastJSONResponse(body, 202, {"Location": base})


def _ended(view: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return view is not None and JobStatus(view["status"]).terminal


def _waiting(
    request: Request, job_id: str, model: str, variant: str, view: dict[str, Any] | None
) -> FastJSONResponse:
    """202 for a wait that ran out: the job's status then, and where it stands while queued
    (no view: Redis could not say, and the job was accepted, so `queued`)."""
    view = view or {"status": JobStatus.QUEUED.value}
    standing = {name: view[name] for name in STANDING_FIELDS if name in view}
    return _accepted(request, job_id, view["status"], model, variant, standing)


def _waited(
    request: Request, job_id: str, model: str, variant: str, view: dict[str, Any] | None
) -> FastJSONResponse:
    """200 with the job if it ended within the wait, else the 202."""
    if _ended(view):
        return FastJSONResponse(view, status_code=200)
    return _waiting(request, job_id, model, variant, view)


async def _unless_gone(request: Request, answer: Coroutine[Any, Any, Response]) -> Response:
    """`answer`, or 499 once the client went away first: a wait noticed it only when it ran
    out (up to `CONVEYOR_MAX_WAIT_S`), holding its handler and its reply waiter for nobody.
    The job runs on: a client that stops waiting has not cancelled it."""
    try:
        return await unless_disconnected(request, answer)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)


@router.post(
    "/v1/jobs",
    status_code=202,
    response_model=JobAccepted,
    responses={
        200: {"model": JobView, "description": "Finished within `wait`"},
        202: {"headers": LOCATED},
        **_ERRORS,
    },
    openapi_extra={"parameters": [KEY_PARAMETER]},
)
async def submit_job(
    body: JobRequest, request: Request, service: SubmitService, wait: float = WAIT
) -> Response:
    """Enqueue a job; with `wait`, answer 200 with the finished job if it ends in time. A
    repeated `Idempotency-Key` with the same body answers with the original job: 200, or,
    with `wait`, as the first request did (202 while it has not ended)."""
    key = idempotency_key(request)
    if wait > 0:
        return await _unless_gone(request, _submitted_and_waited(request, service, body, wait, key))
    submitted = await service.submit(body.model, body, key)
    if not submitted.created:
        return FastJSONResponse(await service.get(submitted.job_id, 0))
    return _accepted(
        request, submitted.job_id, "queued", body.model, submitted.variant, submitted.standing
    )


async def _submitted_and_waited(
    request: Request, service: JobsService, body: JobRequest, wait: float, key: str | None
) -> FastJSONResponse:
    """`POST /v1/jobs?wait=`'s answer, raced against the client's leaving (`_unless_gone`)."""
    job_id, variant, view = await service.submit_and_wait(body.model, body, wait, key)
    return _waited(request, job_id, body.model, variant, view)


@router.get("/v1/jobs/{job_id}", name="get_job", response_model=JobView, responses=_ERRORS)
async def get_job(
    request: Request,
    service: ReadService,
    job_id: str = JOB_ID,
    wait: float = WAIT,
    attempts: ATTEMPTS = False,
) -> Response:
    """Read a job; with `wait`, long-poll until it is terminal or the wait ends; with
    `attempts`, include every attempt at it (worker, times, outcome, error)."""
    read = _read(service, job_id, wait, attempts)
    return await (_unless_gone(request, read) if wait > 0 else read)


async def _read(service: JobsService, job_id: str, wait: float, attempts: bool) -> FastJSONResponse:
    """`get_job`'s answer: raced against the client's leaving when it waits (`_unless_gone`)."""
    return FastJSONResponse(await service.get(job_id, wait, attempts))


@router.delete("/v1/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(service: SubmitService, job_id: str = JOB_ID) -> FastJSONResponse:
    """Cancel a queued or running job (409 if it already ended)."""
    return FastJSONResponse(await service.cancel(job_id))


@router.post(
    "/v1/models/{model}/predict",
    response_model=JobView,
    responses={
        202: {"model": JobAccepted, "description": "Still running", "headers": LOCATED},
        **_PREDICT_ERRORS,
    },
    openapi_extra={"parameters": [KEY_PARAMETER]},
)
async def predict(
    body: PredictRequest,
    request: Request,
    service: SubmitService,
    model: str = Path(pattern=NAME),
    timeout: float = Query(default=30.0, gt=0, le=600, allow_inf_nan=False),
) -> Response:
    """Submit and wait: 200 with outputs, 202 with the job's URLs if it is still running, or
    the error of a job that failed (422), was cancelled (409) or expired (504). A repeated
    `Idempotency-Key` with the same request waits on the job its first try made, as
    `POST /v1/jobs?wait=` does: a client's retry after a lost answer runs nothing twice."""
    key = idempotency_key(request)
    return await _unless_gone(request, _predicted(request, service, model, body, timeout, key))


async def _predicted(
    request: Request,
    service: JobsService,
    model: str,
    body: PredictRequest,
    timeout: float,
    key: str | None,
) -> FastJSONResponse:
    """`predict`'s answer, raced against the client's leaving (`_unless_gone`)."""
    job_id, variant, view = await service.submit_and_wait(model, body, timeout, key)
    if not _ended(view):
        return _waiting(request, job_id, model, variant, view)
    return _predict_response(view)


def _predict_response(view: dict[str, Any]) -> FastJSONResponse:
    status = str(view.get("status"))
    if status == "succeeded":
        return FastJSONResponse(view)
    raise unsuccessful(f"job {view['id']}", status, view.get("error"))
