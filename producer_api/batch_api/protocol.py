"""Request and response bodies of the batches resource, and the shape of one input line."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from producer_api.jobs.protocol import PredictRequest
from shared.file_expiry import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S
from shared.model_names import NAME

WINDOW = r"^[1-9][0-9]{0,6}[smhd]$"


# The routes a batch line may name, as OpenAI's Batch API names its endpoint: one per batch.
Endpoint = Literal["/v1/jobs", "/v1/embeddings", "/v1/chat/completions", "/v1/completions"]
JOBS: Endpoint = "/v1/jobs"
EMBEDDINGS: Endpoint = "/v1/embeddings"
CHAT: Endpoint = "/v1/chat/completions"
COMPLETIONS: Endpoint = "/v1/completions"


class BatchLine(BaseModel):
    """One JSONL line, OpenAI's batch input shape: `{"custom_id", "body", "method"?, "url"?}`;
    `body` is the body of the route `url` names: a job body (`/v1/jobs`, the default), whose
    `model` may be left to the batch, or the request of one of OpenAI's routes."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"] = "POST"
    url: Endpoint = JOBS
    body: dict[str, Any]


class BatchItemBody(PredictRequest):
    """A line's job body; `priority` is accepted but batch items always take the bulk lane."""

    model: str | None = Field(default=None, pattern=NAME)


class OutputExpiresAfter(BaseModel):
    """OpenAI's expiry policy for a batch's output and error files: `seconds` from each file's
    creation (its one `anchor`), the result TTL at most, as an upload's `expires_after`."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=EXPIRES_AFTER_MIN_S, le=EXPIRES_AFTER_MAX_S)


class BatchOptions(BaseModel):
    """Query parameters (JSONL body) or form fields (file upload) of `POST /v1/batches`."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, pattern=NAME, description="Default for every line")
    completion_window: str = Field(
        default="24h", pattern=WINDOW, description="e.g. 30m, 24h; what is left then expires"
    )
    webhook: str | None = Field(
        default=None, max_length=2048, description="POSTed a signed event when the batch ends"
    )
    endpoint: Endpoint | None = Field(
        default=None, description="The url every line names (OpenAI's); else the first line's"
    )
    input_file_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="An uploaded file (POST /v1/files), not a body",
    )
    # OpenAI's bounds: 16 pairs, keys of 1 to 64 characters, values of up to 512
    metadata: (
        dict[
            Annotated[str, Field(min_length=1, max_length=64)],
            Annotated[str, Field(max_length=512)],
        ]
        | None
    ) = Field(default=None, max_length=16, description="Kept and shown with the batch, as OpenAI's")
    output_expires_after: OutputExpiresAfter | None = Field(
        default=None, description="OpenAI's: when its output and error files expire"
    )


class BatchCounts(BaseModel):
    """`total` = `succeeded` + `failed` + `pending`; `failed` counts every line of the errors
    file: `invalid` lines, and items that failed, were `cancelled` or `expired`."""

    total: int
    succeeded: int
    failed: int
    pending: int
    invalid: int
    cancelled: int
    expired: int


class RequestCounts(BaseModel):
    """OpenAI's names for the counts: `completed` = succeeded."""

    total: int
    completed: int
    failed: int


class BatchUrls(BaseModel):
    self: str
    output: str
    errors: str


class WebhookState(BaseModel):
    url: str
    status: str | None = None
    attempts: list[dict[str, Any]] = Field(default_factory=list)


class BatchError(BaseModel):
    """A line the create refused, as OpenAI's batch object lists one."""

    code: str
    line: int
    message: str
    param: str | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchView(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    status: Literal[
        "validating", "in_progress", "finalizing", "completed", "failed", "cancelled", "expired"
    ]
    model: str | None
    endpoint: Endpoint = Field(
        default=JOBS, description="The route its lines name; the output file answers as it does"
    )
    completion_window: str
    counts: BatchCounts
    request_counts: RequestCounts
    input_file_id: str | None = None
    output_file_id: str | None = Field(
        default=None, description="Once it ends: `GET /v1/files/{id}/content` is the output file"
    )
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    errors: BatchErrors | None = Field(
        default=None, description="The first lines its create refused (all: the errors file)"
    )
    created_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelled_at: int | None = None
    expired_at: int | None = None
    expires_at: int
    webhook: WebhookState | None = None
    urls: BatchUrls


class BatchList(BaseModel):
    """OpenAI's list of batches, newest first; `after` = `last_id` pages on."""

    object: Literal["list"] = "list"
    data: list[BatchView]
    first_id: str | None
    last_id: str | None
    has_more: bool
