"""HTTP route of the job-events resource: server-sent events with keep-alive pings."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from producer_api.auth import AUTH_RESPONSES, acting_for
from producer_api.errors import ConveyorError, ErrorBody
from producer_api.events.protocol import EVENT_ID, JobEvent
from producer_api.events.serving import EventsService
from producer_api.jobs.api_router import JOB_ID
from producer_api.state import ProducerState, producer_state
from producer_api.stream_shutdown import RECONNECT_MS, BoundedEventSource, Cut, until_cut
from shared.codec import dumps, is_stream_id

router = APIRouter(tags=["events"])
PING_S = 15

_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    200: {"content": {"text/event-stream": {}}, "description": "token, restart, final events"},
    204: {"description": "Last-Event-ID is the ended job's final event: nothing follows"},
    404: {"model": ErrorBody, "description": "Unknown job"},
    422: {"model": ErrorBody, "description": "Last-Event-ID names no event of the job's stream"},
    429: {"model": ErrorBody, "description": "Rate limited, or the key's streams cap reached"},
}


async def server_sent(
    events: AsyncIterator[JobEvent], shutdown: anyio.Event
) -> AsyncGenerator[ServerSentEvent, None]:
    """The job's events; if the producer shuts down or Redis stops answering first, an
    `error` event (type `unavailable`) with `retry:` ends the stream: reconnect with
    Last-Event-ID to resume. None follows a `final` event: the stream is whole. One that fails
    as a request would (its place among the key's streams taken: `too_many_streams`) ends with
    that error as an `error` event. Closed between events (sse-starlette closes it when a send
    fails), it closes what it streams at once."""
    ended = False
    try:
        async with aclosing(until_cut(events, shutdown)) as cut:
            async for event in cut:
                if isinstance(event, Cut):
                    if not ended:
                        error = {"type": "unavailable", "message": event.message}
                        data = dumps(error).decode()
                        yield ServerSentEvent(data=data, event="error", retry=RECONNECT_MS)
                else:
                    ended = event.event == "final"
                    data = dumps(event.data).decode()
                    yield ServerSentEvent(data=data, event=event.event, id=event.id)
    except ConveyorError as exc:
        error = {"type": exc.type, "message": exc.message}
        yield ServerSentEvent(data=dumps(error).decode(), event="error")


@router.get("/v1/jobs/{job_id}/events", response_class=EventSourceResponse, responses=_RESPONSES)
async def job_events(
    service: Annotated[EventsService, Depends(acting_for("read", EventsService))],
    state: Annotated[ProducerState, Depends(producer_state)],
    job_id: str = JOB_ID,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID", pattern=EVENT_ID),
) -> Response:
    """Stream a job's events. While it is queued: `queued` events (position, ETA) when they
    change, at most once a second, and `scaling` when no worker serves its partition. LLM
    jobs: one `token` event per engine step (id = token-stream entry id), then a `final`
    event with the finish reason and usage; reconnecting with
    `Last-Event-ID` resumes right after that event (204 after the `final` one: nothing
    follows it, and an EventSource stops reconnecting). Other jobs: one `final` event with the job
    when it ends. Every `final` has an id: one made from the job (no entry of its own in the
    stream) has the id after the stream's last entry (`0-1` for none). The job keeps running
    when the client goes away, when this producer shuts down or when Redis stops answering (the
    stream then ends with an `error` event carrying `retry:`); a job gone meanwhile (its record
    expired) ends it with an `error` event (type `not_found`). A `Last-Event-ID` that no stream
    could hold (parts beyond 64 bits), or that names no event this job's stream sent, is refused
    (422); a key holding its cap of streams open (its own `--max-streams`, else
    CONVEYOR_MAX_STREAMS_PER_KEY) gets 429 (`Retry-After`). A stream whose client stopped reading
    renews its place no more; should another stream take it meanwhile, this one ends with an
    `error` event (type `too_many_streams`) when it goes on. Once a send has waited 30 s for it
    to read, the stream is closed (reconnect with Last-Event-ID)."""
    if last_event_id is not None and not is_stream_id(last_event_id):
        message = "Last-Event-ID: not a token-stream entry id (<ms>-<seq>, each within 64 bits)"
        raise ConveyorError(422, "invalid_request", message)
    events = await service.open(job_id, last_event_id)
    if events is None:  # the client has the final event: EventSource's "stop"
        return Response(status_code=204)
    shutdown = anyio.Event()
    return BoundedEventSource(
        server_sent(events, shutdown),
        ping=PING_S,
        shutdown_event=shutdown,
        shutdown_grace_period=state.settings.stream_shutdown_grace_s,
    )
