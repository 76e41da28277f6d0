"""Write-back for a whole micro-batch in one round trip: results, replies (one SPUBLISH per
waiting producer, carrying all its jobs), XACK and XDEL happen in one Lua script, so a result is
visible if and only if its entry is acknowledged; the API keys' in-flight slots (in their own
slots) are freed in the same pipeline.

With `CONVEYOR_REPLICA_ACKS`, the pipeline ends with WAIT on the partition's master and the
replies go out after it, in a second round trip: a producer never hears of a result a failover
could lose."""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from shared import job_scripts
from shared.codec import as_text, dumps
from shared.job_states import JobStatus
from shared.job_store import attempt_json, now_ms, renew_before_ms
from shared.keys import GROUP, Keys
from shared.rate_limit import hold_slots_again, queue_slot_frees
from shared.redis_client import (
    RedisClient,
    check_replica_acks,
    queue_replica_wait,
    queue_script,
    run_pipeline,
)
from shared.settings import get_settings
from shared.variant_stats import VariantStats
from shared.webhook_outbox import WebhookOutbox
from workers.partition.finish import Finish
from workers.partition.finished_stats import FinishedStats
from workers.partition.job_events import JobEvents
from workers.partition.redis_backoff import OUTAGE

log = logging.getLogger(__name__)
BULK_LIMIT = "proto-max-bulk-len"  # the most bytes the server takes in one value
QUERY_LIMIT = "client-query-buffer-limit"  # the most it holds of a command read so far
# What the server's query buffer may hold beside a value, at most the rest of one read
# (PROTO_IOBUF_LEN): a value 2 bytes under `client-query-buffer-limit` was refused when the next
# argument's header came in the same read.
READ_AHEAD = 16 << 10
# Both limits may be set to 1 MiB at least: a batch whose values are within this is never refused.
SMALLEST_VALUE_LIMIT = (1 << 20) - READ_AHEAD
DEFAULTS = {BULK_LIMIT: 512 << 20, QUERY_LIMIT: 1 << 30}
# A write-back's written finishes, and the end FINISH met of each job the API ended meanwhile.
Written = tuple[list[Finish], dict[str, str]]


class ResultWriter:
    def __init__(
        self, client: RedisClient, keys: Keys, ttl_s: int, events: JobEvents, worker: str
    ) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.worker = worker
        self.events = events
        self.outbox = WebhookOutbox(client, keys)
        self._finish = client.register_script(job_scripts.FINISH)
        self.stats = FinishedStats(VariantStats(client, keys))

    async def finish(self, stream: str, batch: list[Finish]) -> list[Finish]:
        """Write and acknowledge the batch, then hand the webhook events of the written ones to
        delivery (only then, so a redelivered job does not notify twice) and take them off the
        lane's owed set; returns the finishes whose results were written (the rest were
        acknowledged only: already terminal, cancelled, or gone). Each finish whose job the API
        ended while it ran gets the end FINISH met (`Finish.met`)."""
        written, met = await self._write(stream, batch)
        for item in batch:
            item.met = met.get(item.job_id, "")
        lane = self._lane(stream, written)
        self.stats.add(
            {**i.context, **i.fields, "status": i.status, "lane": lane, "tenant": i.tenant}
            for i in written
        )
        await self._settle_owed(stream, await self.events.notify(written))
        return written

    def _lane(self, stream: str, written: list[Finish]) -> str:
        """The batch's lane, for the variant's statistics: a canary's p99 leaves out the bulk
        lane's jobs, which wait behind online work by design. One partition's batch: its
        streams are named once (a variant may be called `bulk`, so no suffix test)."""
        if not written:
            return "online"
        context = written[0].context
        bulk = self.keys.bulk_queue(context.get("model", ""), context.get("variant", ""))
        return "bulk" if stream == bulk else "online"

    async def _settle_owed(self, stream: str, handed: list[str]) -> None:
        """One ZREM for the jobs whose events were handed over (none without webhooks). An
        outage only leaves them owed: the reclaimer sends them again, under the same ids,
        where a raise would rerun the write-back and send every event of the batch again."""
        try:
            await self.outbox.settle(stream, handed)
        except OUTAGE as exc:
            log.warning("%d webhook events of %s stay owed: %r", len(handed), stream, exc)

    async def close(self) -> None:
        """Send the variant statistics still gathered (`FinishedStats`)."""
        await self.stats.close()

    async def _write(self, stream: str, batch: list[Finish]) -> Written:
        """The write-back; once more with the results too large for the server failed, if that
        is why it was refused: one over `proto-max-bulk-len` or `client-query-buffer-limit` (a
        protocol error, the connection closed, as in an outage) is refused at every try, and
        the loop's retries, and each worker that reclaimed the batch, were stuck on it for
        good."""
        try:
            return await self._write_once(stream, batch)
        except RedisError:
            if (fitted := await self._fitted(batch)) is None:
                raise
            return await self._write_once(stream, fitted)

    async def _fitted(self, batch: list[Finish]) -> list[Finish] | None:
        """`batch` with each finish holding a value over what the server takes in one value
        failed (`too_large`); None when none does, so the refusal was something else (an
        outage). The server is asked its limits only for a batch with a value over the
        smallest they may be."""
        sizes = [_largest(item) for item in batch]
        if max(sizes, default=0) <= SMALLEST_VALUE_LIMIT:
            return None
        limit = await self._value_limit()
        if all(size <= limit for size in sizes):
            return None
        log.error("%d results over the server's value limit fail", sum(s > limit for s in sizes))
        return [
            too_large(item, size, limit) if size > limit else item
            for item, size in zip(batch, sizes, strict=True)
        ]

    async def _value_limit(self) -> int:
        """The most bytes the server takes in one value, asked on a second connection if need
        be: the refused write's, which the server closed after its protocol error, goes back
        to the pool as if open, and may be the one handed out first."""
        try:
            return await self._asked_value_limit()
        except RedisConnectionError:
            return await self._asked_value_limit()

    async def _asked_value_limit(self) -> int:
        """`proto-max-bulk-len`, or less where `client-query-buffer-limit` is (a value whose
        read overflows the query buffer closes the connection too; a command's values are read
        one by one, so only each one's size counts)."""
        query_limit = await self._config(QUERY_LIMIT) - READ_AHEAD
        return min(await self._config(BULK_LIMIT), query_limit)

    async def _config(self, name: str) -> int:
        """The server's setting `name`; its default where CONFIG is not allowed (a managed
        Redis). Asked one at a time: a Redis before 7 takes one name per CONFIG GET."""
        try:
            config = await self.redis.config_get(name)
        except ResponseError:
            return DEFAULTS[name]
        return int(config.get(name) or DEFAULTS[name])

    async def _write_once(self, stream: str, batch: list[Finish]) -> Written:
        """The written finishes, and the ends FINISH met instead, by job id."""
        if not batch:
            return [], {}
        waits, replies = await run_pipeline(
            self.redis, partial(self._queue_write, stream, batch), [self._finish]
        )
        written_ids, taken_ids = ({as_text(job_id) for job_id in ids} for ids in replies[0][:2])
        met = {as_text(job_id): as_text(status) for job_id, status in replies[0][2]}
        stamps = {as_text(job_id): (as_text(c), as_text(w)) for job_id, c, w in replies[0][3]}
        written = [item for item in batch if item.job_id in written_ids]
        for item in written:
            if item.job_id in stamps:
                item.stamp(*stamps[item.job_id])
        if waits:
            check_replica_acks(replies[-waits:])
            await self._publish(written)
        if taken_ids:
            await self._hold_again([item for item in batch if item.job_id in taken_ids])
        return written, met

    async def _hold_again(self, taken: list[Finish]) -> None:
        """The in-flight slots of jobs another worker took over, freed beside FINISH before its
        reply said so: held again while their new owner runs them (their tenants' limits held
        one job too few). An outage costs only that: a raise would rerun the write-back."""
        try:
            held = [(t.inflight, t.job_id) for t in taken]
            await hold_slots_again(self.redis, held, self.ttl_s, now_ms())
        except OUTAGE as exc:
            log.warning("%d taken-over jobs' in-flight slots not held again: %r", len(taken), exc)

    async def _queue_write(self, stream: str, batch: list[Finish], pipe: Any) -> int:
        """FINISH, the in-flight slots' frees, and the replica WAITs (how many: the return), on
        `pipe`; all safe to run twice (FINISH is idempotent, ZREM too)."""
        queue_script(pipe, self._finish, self._declared(stream, batch), self._args(batch))
        queue_slot_frees(pipe, [(item.inflight, item.job_id) for item in batch if item.status])
        return await queue_replica_wait(self.redis, pipe, [stream])

    def _declared(self, stream: str, batch: list[Finish]) -> list[str]:
        """FINISH's keys: the stream, the results' job hashes and, for webhooks, the owed set,
        so that on a cluster a slot mid-migration refuses the whole call (TRYAGAIN) until they
        are together on one master, never a part of it (a result written, its entry left
        unacknowledged, its webhook owed by no one)."""
        keys = [stream, *(self.keys.job(item.job_id) for item in batch if item.status)]
        # a restamped job's webhook is in its hash only, which FINISH reads (Finish.restamped)
        if any((item.webhook and item.status) or item.restamped for item in batch):
            keys.append(self.keys.webhooks_owed(stream))
        return keys

    def _args(self, batch: list[Finish]) -> list[Any]:
        """FINISH's arguments; its replies are left to `_publish` while replicas must confirm
        first (a record's reply channel and view are sent empty). Only a result carries its
        `write_id`, attempt and webhook mark (FINISH owes its event): an acknowledgement writes
        nothing."""
        publish = not get_settings().replica_acks
        now = now_ms()
        renew_before = renew_before_ms(self.ttl_s, now)
        refill = "1" if any(item.refill for item in batch) else ""
        streamed = "1" if any(item.streamed for item in batch) else ""
        restamped = {item.job_id for item in batch if item.restamped}
        args: list[Any] = [GROUP, self.ttl_s, self.keys.job_prefix, self.worker, renew_before]
        args += [refill, now, streamed, len(restamped), *restamped]
        for item in batch:
            reply, view = (item.reply, _view(item, restamped)) if publish else ("", b"")
            args += [item.entry_id, item.job_id, reply, view, item.status]
            if item.status:
                record = item.record()
                args += [item.write_id, self._attempt(item), "1" if item.webhook else ""]
            else:
                record = item.fields
                args += ["", "", ""]
            args.append(len(record))
            for name, value in record.items():
                args += [name, value]
        return args

    def _attempt(self, item: Finish) -> bytes:
        """This run's entry in the job's attempt history: from its delivery to its result."""
        fields = item.fields
        started, finished, error = (
            fields.get("started"),
            fields.get("finished"),
            fields.get("error"),
        )
        return attempt_json(self.worker, started, finished, item.status, error)

    async def _publish(self, written: list[Finish]) -> None:
        """One SPUBLISH per reply channel, of the views of its written jobs (FINISH's own
        message, sent once the replicas hold the results), or more for views too large
        together (`_messages`)."""
        by_channel: dict[str, list[bytes]] = {}
        for item in written:
            if item.reply:
                by_channel.setdefault(item.reply, []).append(item.message())
        async with self.redis.pipeline(transaction=False) as pipe:
            for channel, views in by_channel.items():
                for message in _messages(views):
                    pipe.spublish(channel, message)
            await pipe.execute()


def _messages(views: list[bytes]) -> list[bytes]:
    """A channel's views as JSON arrays, each within SMALLEST_VALUE_LIMIT where the views allow
    (a larger one goes alone): as one array, a producer's results, each within the server's
    limits, could be one value over them, refused at every retry of the write-back."""
    parts: list[list[bytes]] = [[]]
    size = 1  # the opening bracket; each view counts with the comma or bracket after it
    for view in views:
        if parts[-1] and size + len(view) + 1 > SMALLEST_VALUE_LIMIT:
            parts.append([])
            size = 1
        parts[-1].append(view)
        size += len(view) + 1
    return [b"[" + b",".join(part) + b"]" for part in parts]


def _view(item: Finish, restamped: set[str]) -> bytes:
    """The reply FINISH publishes for `item`; without `created` for FINISH to put in its
    hash's when its own is untrusted (`Finish.restamped`)."""
    return (item.unstamped() if item.job_id in restamped else item).message()


def _largest(item: Finish) -> int:
    """The bytes of the largest value the write-back of `item` sends (its reply embeds its
    outputs)."""
    return max(len(item.message()), *(_size(value) for value in item.record().values()), 0)


def _size(value: str | bytes) -> int:
    return len(value.encode() if isinstance(value, str) else value)


def too_large(item: Finish, size: int, limit: int) -> Finish:
    """`item` without the values the server refuses for their size: a result fails saying so;
    the record of a run cancelled meanwhile, or an acknowledgement, keeps the rest only."""
    fields = {name: value for name, value in item.fields.items() if _size(value) <= limit}
    if item.status in ("", JobStatus.CANCELLED):
        return replace(item, fields=fields)
    fields.pop("outputs", None)
    message = f"the result ({size} bytes) is over the {limit} bytes Redis takes in one value"
    fields["error"] = dumps({"type": "ResultTooLarge", "message": message}).decode()
    return replace(item, status=JobStatus.FAILED, fields=fields)
