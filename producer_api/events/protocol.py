"""What the job-events stream carries. Each SSE event has a name (`queued`, `scaling`, `token`,
`restart`, `final`, `error`), an id (the token stream's entry id, so `Last-Event-ID` resumes
exactly after it; a final made from the job, with no entry of its own, the id after the stream's
last entry) and JSON data; the models below are that data's contract: they refuse a field they
do not name, and tests/test_events_r39_contract.py parses real streams' events with them, so
the stream and these models (and README's SSE section) cannot drift apart unseen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

# A token-stream entry id, as Redis writes it (`<ms>-<seq>`).
EVENT_ID = r"^\d{1,20}-\d{1,20}$"


@dataclass(slots=True)
class JobEvent:
    """One event to send: `id` is None where there is nothing to resume from."""

    event: str
    data: dict[str, Any]
    id: str | None = None


class EventData(BaseModel):
    """An event's data: exactly the fields named (a field without a default is always sent)."""

    model_config = ConfigDict(extra="forbid")


class QueuedData(EventData):
    """`event: queued`: where a queued job stands, sent when it changes, at most once a
    second. `eta_ms` is null when the partition has no drain rate to tell it from."""

    queue_position: int
    eta_ms: int | None


class ScalingData(QueuedData):
    """`event: scaling`: no worker serves the job's partition; the autoscaler starts one from
    the queue depth (KEDA scales from zero on it)."""

    consumers: int
    warming: int  # workers starting (loading their engines) for the partition
    message: str


class RestartData(EventData):
    """`event: restart`: its data is `{}` (see FinalData)."""


class TokenData(EventData):
    """`event: token`: new text of one engine step, and its tokens (the text is empty for a
    step that decoded none, often the last: its end-of-sequence token). The `tokens` of a
    run's events add up to its usage's `completion_tokens`."""

    text: str
    tokens: int


class Usage(EventData):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FinalData(EventData):
    """`event: final` of an LLM job: how it ended. (For other jobs the final event's data is
    the job itself, as `GET /v1/jobs/{id}` shows it.) `usage` is absent for a job that ended
    with none (cancelled or expired while queued); `error` is the job's, where it has one.
    `restart` (data `{}`) means the job was redelivered after its worker died, or its token
    stream expired before this reader read it to its end (then one `token` with the job's whole
    text follows): discard the text received so far."""

    status: str
    finish_reason: str | None
    usage: Usage | None = None
    error: dict[str, str] | None = None
