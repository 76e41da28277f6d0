"""Webhooks of single jobs: once a result is written or a job is dead-lettered (and only then,
so a redelivered job does not notify twice), its signed event is handed to the Celery delivery
task, which retries with backoff and survives this worker."""

from __future__ import annotations

from typing import Any

from shared.webhook_events import WebhookDispatcher, event
from workers.partition.finish import Finish


class JobEvents:
    def __init__(self, broker_url: str) -> None:
        self.dispatcher = WebhookDispatcher(broker_url)

    async def notify(self, written: list[Finish]) -> None:
        for item in written:
            if item.webhook:
                await self.send(item.job_id, item.webhook, item.view())

    async def send(self, job_id: str, url: str, view: dict[str, Any]) -> None:
        """Hand one event to delivery; one the broker refuses is logged, not raised: raising
        would end the worker's loop (kombu's error is no Redis outage) or, for an outage, rerun
        the write-back before it and send the batch's other events twice."""
        await self.dispatcher.hand_over("job", job_id, url, event(f"job.{view['status']}", view))
