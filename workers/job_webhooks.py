"""Webhooks of single jobs: once a result is written (and only then, so a redelivered job does
not notify twice), its signed event is handed to the Celery delivery task, which retries with
backoff and survives this worker."""

from __future__ import annotations

import asyncio

from shared.webhooks import WebhookDispatcher, event
from workers.result_writer import Finish


class JobWebhooks:
    def __init__(self, broker_url: str) -> None:
        self.dispatcher = WebhookDispatcher(broker_url)

    async def notify(self, written: list[Finish]) -> None:
        for item in written:
            if item.webhook:
                body = event(f"job.{item.status}", item.view())
                await asyncio.to_thread(
                    self.dispatcher.send, "job", item.job_id, item.webhook, body
                )
