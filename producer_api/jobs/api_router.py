"""HTTP routes of the jobs resource: parse, call JobsService, return."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request

from producer_api.errors import ConveyorError
from producer_api.jobs.protocol import JobAccepted, JobRequest, JobView, PredictRequest
from producer_api.jobs.serving import JobsService
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state

router = APIRouter(tags=["jobs"])
JOB_ID = Path(max_length=128, description="Job id")
IDEMPOTENCY_KEY = Header(
    default=None, alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$"
)
WAIT = Query(default=0.0, ge=0, le=600, description="Seconds to wait for a terminal state")


def jobs_service(state: Annotated[ProducerState, Depends(producer_state)]) -> JobsService:
    return JobsService(state)


Service = Annotated[JobsService, Depends(jobs_service)]

_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "Unknown model, variant or job"},
    409: {"description": "Idempotency-Key reused with another body, or job already ended"},
    413: {"description": "Body too large"},
    422: {"description": "Invalid request"},
    429: {"description": "Partition full; see Retry-After"},
    503: {"description": "Queue unreachable"},
}


def _accepted(
    request: Request, job_id: str, status: str, model: str, variant: str
) -> dict[str, Any]:
    base = str(request.url_for("get_job", job_id=job_id))
    return {
        "id": job_id,
        "status": status,
        "model": model,
        "variant": variant,
        "urls": {"self": base, "events": f"{base}/events"},
    }


def _wait_limit(request: Request, wait: float) -> float:
    state: ProducerState = request.app.state.conveyor
    return min(wait, state.settings.max_wait_s)


@router.post("/v1/jobs", status_code=202, response_model=JobAccepted, responses=_ERRORS)
async def submit_job(
    body: JobRequest,
    request: Request,
    service: Service,
    wait: float = WAIT,
    idempotency_key: str | None = IDEMPOTENCY_KEY,
) -> FastJSONResponse:
    """Enqueue a job; with `wait`, answer 200 with the finished job if it ends in time. A
    repeated `Idempotency-Key` with the same body answers 200 with the original job."""
    if idempotency_key is not None:
        job_id, variant, created = await service.submit(body.model, body, idempotency_key)
        if not created:
            return FastJSONResponse(await service.get(job_id, _wait_limit(request, wait)))
        return FastJSONResponse(_accepted(request, job_id, "queued", body.model, variant), 202)
    if wait > 0:
        job_id, variant, view = await service.submit_and_wait(
            body.model, body, _wait_limit(request, wait)
        )
        if view is not None:
            return FastJSONResponse(view, status_code=200)
        return FastJSONResponse(_accepted(request, job_id, "queued", body.model, variant), 202)
    job_id, variant, _ = await service.submit(body.model, body)
    return FastJSONResponse(_accepted(request, job_id, "queued", body.model, variant), 202)


@router.get("/v1/jobs/{job_id}", name="get_job", response_model=JobView, responses=_ERRORS)
async def get_job(
    request: Request, service: Service, job_id: str = JOB_ID, wait: float = WAIT
) -> FastJSONResponse:
    """Read a job; with `wait`, long-poll until it is terminal or the wait ends."""
    return FastJSONResponse(await service.get(job_id, _wait_limit(request, wait)))


@router.delete("/v1/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(service: Service, job_id: str = JOB_ID) -> FastJSONResponse:
    """Cancel a queued or running job (409 if it already ended)."""
    return FastJSONResponse(await service.cancel(job_id))


@router.post("/v1/models/{model}/predict", response_model=JobView, responses=_ERRORS)
async def predict(
    body: PredictRequest,
    request: Request,
    service: Service,
    model: str = Path(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$"),
    timeout: float = Query(default=30.0, gt=0, le=600),
) -> FastJSONResponse:
    """Submit and wait: 200 with outputs, or 202 with the job's URLs if it is still running."""
    job_id, variant, view = await service.submit_and_wait(
        model, body, _wait_limit(request, timeout)
    )
    if view is None:
        return FastJSONResponse(_accepted(request, job_id, "queued", model, variant), 202)
    return _predict_response(view)


def _predict_response(view: dict[str, Any]) -> FastJSONResponse:
    status = view.get("status")
    if status == "succeeded":
        return FastJSONResponse(view)
    error = view.get("error") or {}
    message = f"job {view['id']} {status}: {error.get('message', '')}".rstrip(": ")
    codes = {"failed": 422, "cancelled": 409, "expired": 504}
    raise ConveyorError(codes.get(str(status), 500), error.get("type", str(status)), message)
