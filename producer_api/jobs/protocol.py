"""Request and response bodies of the jobs resource."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.model_names import NAME


class PredictRequest(BaseModel):
    """A job body without the model (the path names it). Unknown fields are refused, since a
    typo such as `input` would otherwise be silently ignored. Infinite or NaN times are
    refused (422) rather than reaching the deadline arithmetic, as are times that are no JSON
    number (`true` was a one-second `ttl_s`, `"5"` read as 5)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    variant: str | None = Field(default=None, pattern=NAME)
    inputs: dict[str, Any]
    parameters: dict[str, Any] = Field(default_factory=dict)
    routing_key: str | None = Field(default=None, max_length=256)
    deadline: float | None = Field(
        default=None,
        gt=0,
        le=1e11,
        strict=True,
        description="Unix time after which not to run; one already past is refused (422)",
    )
    # a millisecond at least: deadlines are whole Unix ms, so a shorter one was already past
    # when enqueued (accepted only to expire), as a past `deadline` is refused
    ttl_s: float | None = Field(
        default=None, ge=0.001, le=1e9, strict=True, description="Seconds from now to deadline"
    )
    priority: Literal["online", "bulk"] = "online"
    webhook: str | None = Field(
        default=None,
        max_length=2048,
        description="POSTed a signed event when the job ends; must match the allow-list",
    )


class JobRequest(PredictRequest):
    model: str = Field(pattern=NAME)


class JobUrls(BaseModel):
    self: str
    events: str


class JobAccepted(BaseModel):
    id: str
    status: str
    model: str
    variant: str
    urls: JobUrls
    queue_position: int | None = Field(
        default=None, description="Entries ahead of the job in its lane when this was answered"
    )
    eta_ms: int | None = Field(
        default=None, description="Estimated ms until it starts; null while no rate is known"
    )


class JobError(BaseModel):
    """Why a job did not succeed: an exception's name, `DeadlineExceeded`, `DeadLettered`..."""

    type: str
    message: str


class Attempt(BaseModel):
    """One delivery of a job to a worker and how it ended; `crashed`: the worker stopped
    answering and another took the job over."""

    consumer: str | None = Field(default=None, description="The worker's consumer name")
    host: str | None = None
    pid: int | None = None
    started: float | None = Field(default=None, description="Unix time it was handed over")
    ended: float | None = Field(default=None, description="Unix time it ended")
    outcome: Literal["succeeded", "failed", "crashed", "expired", "cancelled", "dead-lettered"]
    error: JobError | None = None


class JobView(BaseModel):
    id: str
    status: str
    model: str | None = None
    variant: str | None = None
    outputs: Any = None
    error: JobError | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    batch_size: int | None = None
    attempts: int | None = None
    replay_of: str | None = Field(
        default=None, description="A dead letter's replay: the id of the job it runs again"
    )
    prompt_tokens: int | None = Field(
        default=None, description="A generate job's, once it ended: tokens of its prompt"
    )
    completion_tokens: int | None = Field(
        default=None, description="A generate job's, once it ended: tokens it generated"
    )
    queue_position: int | None = Field(
        default=None, description="Only while queued: entries ahead of it in its lane"
    )
    eta_ms: int | None = Field(
        default=None, description="Only while queued: estimated ms until it starts (or null)"
    )
    attempt_history: list[Attempt] | None = Field(
        default=None, description="Every attempt, oldest first; only with `?attempts=true`"
    )
