"""HTTP route of the job-events resource: server-sent events with keep-alive pings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path
from sse_starlette import EventSourceResponse, ServerSentEvent

from producer_api.auth import AUTH_RESPONSES, Principal, require
from producer_api.errors import ErrorBody
from producer_api.events.protocol import EVENT_ID, JobEvent
from producer_api.events.serving import EventsService
from producer_api.state import ProducerState, producer_state
from shared.codec import dumps

router = APIRouter(tags=["events"])
PING_S = 15

_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    200: {"content": {"text/event-stream": {}}, "description": "token, restart, final events"},
    404: {"model": ErrorBody, "description": "Unknown job"},
}


async def events_service(
    state: Annotated[ProducerState, Depends(producer_state)],
    principal: Annotated[Principal, Depends(require("read"))],
) -> EventsService:
    return EventsService(state, principal)


async def server_sent(events: AsyncIterator[JobEvent]) -> AsyncIterator[ServerSentEvent]:
    async for event in events:
        yield ServerSentEvent(data=dumps(event.data).decode(), event=event.event, id=event.id)


@router.get("/v1/jobs/{job_id}/events", response_class=EventSourceResponse, responses=_RESPONSES)
async def job_events(
    service: Annotated[EventsService, Depends(events_service)],
    job_id: str = Path(max_length=128, description="Job id"),
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID", pattern=EVENT_ID),
) -> EventSourceResponse:
    """Stream a job's events. LLM jobs: one `token` event per engine step (id = token-stream
    entry id), then a `final` event with the finish reason and usage; reconnecting with
    `Last-Event-ID` resumes right after that event. Other jobs: one `final` event with the job
    when it ends. The job keeps running when the client goes away."""
    events = await service.open(job_id, last_event_id)
    return EventSourceResponse(server_sent(events), ping=PING_S)
