"""A Batch API batch's progress and its end: counts from the item job hashes (counted once, as
they finish, so each look costs what changed), finalization by exactly one caller, early ends
(cancel, expiry) and the webhook. Shared by `GET /v1/batches/{id}` and the sweeper, so a batch
finishes and notifies even when no client is polling."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from producer_api.batch_api.feeding import BatchFeeder
from producer_api.batch_api.protocol import JOBS
from shared.batch_api_store import (
    CHUNK,
    BatchApiStore,
    BatchStatus,
    HeldLane,
    Refresh,
    ended_early,
    final_counts,
)
from shared.codec import dumps, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore
from shared.webhook_events import WebhookDispatcher, event

log = logging.getLogger(__name__)

_TIMESTAMPS = (
    "created",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "cancelled",
    "expired",
    "expires",
)
FINALIZER_POLL_S = 0.05  # how often an early end looks at another caller's finalization


def _seconds(fields: dict[str, str], name: str) -> int | None:
    """Whole Unix seconds, as OpenAI's Batch object gives its times: a client with integer
    types (openai-go's int64) could not read a batch whose times had fractions."""
    value = fields.get(name)
    return int(value) // 1000 if value else None


# The refused lines a batch's object names in `errors`, as OpenAI's names its validation errors:
# the first few (its errors file holds every one).
ERRORS_SHOWN = 10


def first_errors(rejected: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The batch hash's `errors` field for the lines its create refused (none: no field), each
    as OpenAI's batch error: an OpenAI client reads a failed batch's `errors.data`, which was
    always null, however many of its lines were refused."""
    if not rejected:
        return {}
    data = [
        {"code": r["error"]["type"], "line": r["line"], "message": r["error"]["message"]}
        for r in rejected[:ERRORS_SHOWN]
    ]
    return {"errors": dumps([{**d, "param": None} for d in data]).decode()}


def batch_url(base: str, batch_id: str) -> str:
    """A batch's URL under `base` (a link base, `jobs.api_router.link_base`; empty: its path)."""
    return f"{base}/v1/batches/{batch_id}"


def view(batch_id: str, progress: Refresh, base: str | None) -> dict[str, Any]:
    """The public shape of a batch (`BatchView`); `base` is its URL (or path), None for a view
    without `urls` (the console's live feed, whose page links each batch under its own base)."""
    fields, counts = progress.fields, progress.counts
    total, invalid = int(fields.get("total", 0)), int(fields.get("invalid", 0))
    failed = _failed(progress)
    body: dict[str, Any] = {
        "id": batch_id,
        "object": "batch",
        "status": fields["status"],
        "model": fields.get("model") or None,
        "endpoint": fields.get("endpoint") or JOBS,
        "completion_window": fields.get("completion_window", ""),
        "counts": {
            "total": total,
            "succeeded": counts["succeeded"],
            "failed": failed,
            "pending": total - counts["succeeded"] - failed,
            "invalid": invalid,
            "cancelled": counts["cancelled"],
            "expired": counts["expired"],
        },
        "request_counts": {"total": total, "completed": counts["succeeded"], "failed": failed},
        "input_file_id": fields.get("input_file_id"),
        **file_ids(batch_id, progress),
        "metadata": loads(fields["metadata"]) if "metadata" in fields else None,
        "errors": {"object": "list", "data": loads(fields["errors"])}
        if "errors" in fields
        else None,
        **{f"{name}_at": _seconds(fields, f"{name}_at") for name in _TIMESTAMPS},
        "webhook": None,
    }
    if base is not None:
        body["urls"] = {"self": base, "output": f"{base}/output", "errors": f"{base}/errors"}
    if url := fields.get("webhook"):
        attempts = loads(fields.get("webhook_attempts") or "[]")
        body["webhook"] = {"url": url, "status": fields.get("webhook_status"), "attempts": attempts}
    return body


# The ids `GET /v1/files/{id}/content` serves an ended batch's output and errors files under.
BATCH_FILE = re.compile(r"(batch_[0-9a-f]{32})-(output|errors)")  # matched whole


def batch_file_name(batch_id: str, kind: str) -> str:
    """A batch's output or errors file's name (`kind`: output, errors), as OpenAI's file object
    names it; its download is saved under it too."""
    return f"{batch_id}_{kind}.jsonl"


def _failed(progress: Refresh) -> int:
    """The batch's lines that did not succeed: refused at create, failed, cancelled, expired."""
    counts = progress.counts
    invalid = int(progress.fields.get("invalid", 0))
    return invalid + counts["failed"] + counts["cancelled"] + counts["expired"]


def file_ids(batch_id: str, progress: Refresh) -> dict[str, str | None]:
    """An ended batch's file ids, each only when it holds a line, as OpenAI's: a client that
    fetches `error_file_id` when it is set read an empty file for a batch with no error. The
    Files API serves these ids alone (`BatchApiService.kept`)."""
    ended = BatchStatus(progress.fields["status"]).terminal
    outputs, errors = progress.counts["succeeded"], _failed(progress)
    return {
        "output_file_id": f"{batch_id}-output" if ended and outputs else None,
        "error_file_id": f"{batch_id}-errors" if ended and errors else None,
    }


class BatchApiProgress:
    def __init__(
        self,
        jobs: JobStore,
        store: BatchApiStore,
        webhooks: WebhookDispatcher,
        public_url: str = "",
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.webhooks = webhooks
        # its webhook event's links' base (CONVEYOR_PUBLIC_URL): the sweeper sends it with no
        # request to take one from, so unset they stay paths
        self.public_url = public_url
        self.feeder = BatchFeeder(jobs, store)

    async def refresh(self, batch_id: str, window: int) -> Refresh | None:
        """Count what finished (looking `window` items past each partition's first unfinished
        one for stragglers finished out of order); finalize when nothing is left. None: no such
        batch."""
        progress = await self.store.refresh(batch_id, window)
        if progress is not None and progress.finalize:
            await self._finalize(batch_id, progress)
        return progress

    async def end(self, batch_id: str, ending: BatchStatus) -> BatchStatus | None:
        """Cancel or expire what is left of a running batch; returns the ending in force (an
        earlier request's, if there was one) or None when the batch is not running. Settling
        is idempotent, so a producer that died half-way is simply repeated. Held items end
        first, so that none is enqueued after (a feeder's ENQUEUE finds their records)."""
        _, in_force = await self.store.request_end(batch_id, ending)
        if in_force is None:
            return None
        fields = await self.store.read(batch_id) or {}
        await self.store.end_held(fields, in_force)
        ids = await self.store.open_ids(fields)
        error = ended_early(in_force).decode()
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            await self.jobs.settle_many(chunk, JobStatus(in_force.value), {"error": error})
        await self._until_ended(batch_id)
        return in_force

    async def _until_ended(self, batch_id: str) -> None:
        """Count the settled items, then wait out a finalizer that another caller (the
        sweeper, the console, a second producer) began between our settling and our count, so
        the ending is in force when we return. One that went silent is taken over by `refresh`
        after STALE_MS."""
        progress = await self.refresh(batch_id, window=0)
        while progress is not None and progress.fields["status"] == BatchStatus.FINALIZING:
            await asyncio.sleep(FINALIZER_POLL_S)
            progress = await self.refresh(batch_id, window=0)

    async def feed(self, lanes: list[HeldLane]) -> None:
        """Feed running batches' held items into their lanes as room frees (`BatchFeeder`)."""
        await self.feeder.feed(lanes)

    async def notify(self, batch_id: str, progress: Refresh) -> bool:
        """Hand the batch's terminal view to the webhook task (Celery, so it survives us), then
        mark it `pending` unless the task has marked it already, or its hash expired meanwhile
        (not brought back). At least once: a producer that
        dies between the two hands it over again (`complete`). False when the broker refused
        it: the batch's end stands (a create or a read that raised answered 500 for a batch
        that had ended), and the sweeper's `complete` hands it over again."""
        url = progress.fields.get("webhook")
        if not url:
            return True
        data = view(batch_id, progress, batch_url(self.public_url, batch_id))
        status = progress.fields["status"]
        # one id and one `created` (the batch's end) for the batch's end: a sweeper completing
        # a finalizer it took for dead may hand the same event over a second time, which
        # receivers then drop as a repeat; stamped with its own clock, it was created later
        owner = progress.fields.get("tenant", "default")
        ended = data.get(f"{status}_at")
        body = event(f"batch.{status}", owner, data, f"{batch_id}_{status}", ended)
        if not await self.webhooks.hand_over("batch", batch_id, url, body):
            return False
        await self.store.set_field_unless_set(batch_id, "webhook_status", "pending")
        return True

    async def complete(self, batch_id: str, progress: Refresh) -> None:
        """What follows an ended batch's commit: its webhook handed over (unless it was), then
        its keys in other slots released. The sweeper repeats it for a batch whose finalizer
        died after the commit, or whose webhook the broker refused (it is still in the active
        index), so the webhook is not lost."""
        if "webhook_status" not in progress.fields and not await self.notify(batch_id, progress):
            return
        await self.store.release(batch_id, progress.fields)

    async def _finalize(self, batch_id: str, progress: Refresh) -> None:
        ending = BatchStatus(progress.fields.get("ending") or BatchStatus.COMPLETED)
        status = await self.store.finish(batch_id, ending)  # expired, for a late result
        fresh = await self.store.read(batch_id)
        if fresh is None:
            progress.fields = {**progress.fields, "status": status.value}
        else:  # counted as `finish` counted them (an expired batch's late results `expired`)
            progress.fields, progress.counts = fresh, final_counts(fresh)
        log.info("batch %s %s: %s", batch_id, status.value, progress.counts)
        await self.complete(batch_id, progress)
