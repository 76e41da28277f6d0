"""Webhooks of single jobs: once a result is written or a job is dead-lettered (and only then,
so a redelivered job does not notify twice), its signed event is handed to the Celery delivery
task, which retries with backoff and survives this worker. The script that ended the job left
it owed (shared/job_scripts.py, `owe`): the caller takes it off once this hands it over, and
the reclaimer re-sends one a dead worker left owed, under the same event id."""

from __future__ import annotations

from typing import Any

from shared.webhook_events import WebhookDispatcher, job_event
from workers.partition.finish import Finish


class JobEvents:
    def __init__(self, broker_url: str) -> None:
        self.dispatcher = WebhookDispatcher(broker_url)

    async def notify(self, written: list[Finish]) -> list[str]:
        """Hand over the events of the written jobs with webhooks, up to the first the broker
        refuses; returns the ids handed over (the rest stay owed, for the reclaimer to send once
        overdue). A broker that is down refuses each only after kombu's retries: handed over
        one by one, the write-back's loop sat out one refusal per job, and logged each."""
        handed: list[str] = []
        for item in written:
            if not item.webhook:
                continue
            if not await self.send(item.job_id, item.webhook, item.view(), item.tenant):
                break
            handed.append(item.job_id)
        return handed

    async def send(self, job_id: str, url: str, view: dict[str, Any], tenant: str) -> bool:
        """Hand one event of `tenant`'s job to delivery; whether the broker took it. One it
        refuses is logged, not raised: raising would end the worker's loop (kombu's error is no
        Redis outage) or, for an outage, rerun the write-back before it and send the batch's
        other events twice."""
        return await self.dispatcher.hand_over("job", job_id, url, job_event(view, tenant))
