"""Typed results of the SDK. Unknown fields are kept (servers add fields before clients learn
them), so a newer producer never breaks an older client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

JOB_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
BATCH_TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class ErrorInfo(_Open):
    type: str
    message: str = ""


class Attempt(_Open):
    """One delivery of a job to a worker (`get(job_id, attempts=True)`): who ran it, from when
    to when (Unix seconds) and how it ended (`succeeded`, `failed`, `crashed`, `expired`,
    `cancelled`, `dead-lettered`). Fields in the API's order: a dump (`jobs get --attempts`)
    prints them so."""

    consumer: str | None = None
    host: str | None = None
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    outcome: str
    error: ErrorInfo | None = None


class Job(_Open):
    id: str
    status: str
    model: str | None = None
    variant: str | None = None
    outputs: Any = None
    error: ErrorInfo | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    batch_size: int | None = None
    attempts: int | None = None
    replay_of: str | None = None  # a dead letter's replay: the job it runs again
    prompt_tokens: int | None = None  # a generate job's
    completion_tokens: int | None = None
    attempt_history: list[Attempt] | None = None
    # Only while queued: entries ahead of it in its lane, and ms until it should start (None
    # while the producer knows no drain rate, e.g. no worker serves the partition yet).
    queue_position: int | None = None
    eta_ms: int | None = None
    urls: dict[str, str] | None = None

    @property
    def done(self) -> bool:
        return self.status in JOB_TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


class BatchCounts(_Open):
    total: int
    succeeded: int
    failed: int
    pending: int
    invalid: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


class RequestCounts(_Open):
    """OpenAI's names for a batch's counts: `completed` = succeeded."""

    total: int
    completed: int
    failed: int


class Batch(_Open):
    id: str
    object: str = "batch"
    status: str
    model: str | None = None
    endpoint: str = "/v1/jobs"
    completion_window: str | None = None
    counts: BatchCounts
    request_counts: RequestCounts | None = None
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    # the first lines its create refused, {object, data: [{code, line, message, param}]}
    errors: dict[str, Any] | None = None
    created_at: int  # whole Unix seconds, as the server (and OpenAI) gives them
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelled_at: int | None = None
    expired_at: int | None = None
    expires_at: int | None = None
    webhook: dict[str, Any] | None = None
    urls: dict[str, str] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in BATCH_TERMINAL


class BatchList(_Open):
    """A page of the tenant's batches, newest first; `last_id` is the next page's `after`."""

    object: str = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class FileObject(_Open):
    """OpenAI's file object: an upload (purpose `batch`), or an ended batch's output or errors
    file (`batch_output`); times in Unix seconds, `expires_at` when it goes."""

    id: str
    object: str = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str


class FileList(_Open):
    """A page of the tenant's uploads, newest first unless asked otherwise; `last_id` is the
    next page's `after`."""

    object: str = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool


class FileDeleted(_Open):
    id: str
    object: str = "file"
    deleted: bool


class BatchOutput(_Open):
    """One line of a batch's output file: the job's `outputs`, or in a batch of lines for
    one of OpenAI's routes OpenAI's `response` (`{status_code, request_id, body}`, `body`
    being the route's answer) and `error`."""

    id: str
    custom_id: str
    line: int
    outputs: Any = None
    response: dict[str, Any] | None = None


class BatchError(_Open):
    """One line of a batch's errors file; `id` is absent for lines that never became jobs."""

    custom_id: str | None = None
    line: int
    status: str
    error: ErrorInfo
    id: str | None = None


class BatchResults(_Open):
    outputs: list[BatchOutput]
    errors: list[BatchError]


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event."""

    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return orjson.loads(self.data)


class ChatMessage(_Open):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(_Open):
    index: int = 0
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: Any = None


class Usage(_Open):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatCompletion(_Open):
    id: str
    object: str = "chat.completion"
    created: int = 0
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None

    @property
    def text(self) -> str:
        return self.choices[0].message.content or "" if self.choices else ""


class ChunkDelta(_Open):
    role: str | None = None
    content: str | None = None


class ChunkChoice(_Open):
    index: int = 0
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: Any = None


class ChatCompletionChunk(_Open):
    id: str
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Embedding(_Open):
    object: str = "embedding"
    index: int
    embedding: list[float] | str  # a string: base64 of little-endian float32 values


class EmbeddingUsage(_Open):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingList(_Open):
    """OpenAI's embeddings answer; `Client.embed` hands each vector back as numbers."""

    object: str = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage | None = None
