"""Job events without HTTP. An LLM job streams its token stream from where the client left off
(every missed chunk once, then live ones, then one final event); any other job sends a single
final event when it ends, woken by the reply listener rather than by polling."""

from __future__ import annotations

from collections.abc import AsyncIterator

from producer_api.auth.principal import Principal
from producer_api.events.protocol import JobEvent
from producer_api.jobs.serving import JobsService
from producer_api.state import ProducerState
from producer_api.token_hub import TokenFollower
from shared.job_states import JobStatus

START = "0-0"


class EventsService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.jobs = JobsService(state, principal)

    async def open(self, job_id: str, last_event_id: str | None) -> AsyncIterator[JobEvent]:
        """The caller's job's events after `last_event_id`; raises 404 (before any event is
        sent) when the job is unknown or another tenant's."""
        record = await self.jobs.owned(job_id)
        config = self.state.repository.get(record.fields.get("model", ""))
        if config is not None and config.kind == "generate":
            return self._tokens(job_id, last_event_id or START)
        return self._final(job_id)

    async def _tokens(self, job_id: str, after: str) -> AsyncIterator[JobEvent]:
        follower = TokenFollower(self.state.tokens, self.state.job_store, self.state.keys)
        async for event in follower.follow(job_id, after):
            yield JobEvent(event.kind, event.data(), event.id or None)

    async def _final(self, job_id: str) -> AsyncIterator[JobEvent]:
        """Long-poll in rounds of `max_wait_s` (keep-alive pings flow meanwhile)."""
        view = await self.jobs.get(job_id, self.state.settings.max_wait_s)
        while not JobStatus(view["status"]).terminal:
            view = await self.jobs.get(job_id, self.state.settings.max_wait_s)
        yield JobEvent("final", view)
