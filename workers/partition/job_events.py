"""Webhooks of single jobs: once a result is written or a job is dead-lettered (and only then,
so a redelivered job does not notify twice), its signed event is handed to the Celery delivery
task, which retries with backoff and survives this worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shared.webhook_events import WebhookDispatcher, event
from workers.partition.finish import Finish

log = logging.getLogger(__name__)


class JobEvents:
    def __init__(self, broker_url: str) -> None:
        self.dispatcher = WebhookDispatcher(broker_url)

    async def notify(self, written: list[Finish]) -> None:
        for item in written:
            if item.webhook:
                await self.send(item.job_id, item.webhook, item.view())

    async def send(self, job_id: str, url: str, view: dict[str, Any]) -> None:
        """Hand one event to delivery. A broker that refuses it once kombu has retried the
        publish costs that event, logged: raising would end the worker's loop (kombu's error is
        no Redis outage) or, for an outage, rerun the write-back before it and send the
        batch's other events twice."""
        body = event(f"job.{view['status']}", view)
        try:
            await asyncio.to_thread(self.dispatcher.send, "job", job_id, url, body)
        except Exception as exc:
            log.error("webhook %s of job %s not handed to delivery: %r", body["type"], job_id, exc)
