"""The Batch API logic without HTTP: validate every line, enqueue the valid ones on the bulk lane
in pipelined chunks, read progress, cancel, and stream results and errors as JSONL."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.batch_api import lines
from producer_api.batch_api.progress import batch_file_name, file_ids, first_errors
from producer_api.batch_api.protocol import CHAT, COMPLETIONS, EMBEDDINGS, JOBS, BatchOptions
from producer_api.errors import ConveyorError
from producer_api.jobs.admission import BodyPrint
from producer_api.jobs.protocol import PredictRequest
from producer_api.jobs.serving import JobsService
from producer_api.models.serving import model_of
from producer_api.openai.embedding_serving import (
    EMBEDDING_INPUT,
    EmbeddingService,
    embedding_list,
)
from producer_api.openai.protocol import ChatCompletionRequest, CompletionRequest
from producer_api.openai.serving import (
    ChatRenderer,
    CompletionRenderer,
    context_exceeded,
    generation_of,
    job_failure,
)
from producer_api.state import ProducerState
from shared.batch_api_store import (
    BY_BATCH,
    CHUNK,
    OUTPUT_EXPIRES_AFTER,
    BatchStatus,
    HeldLane,
    ItemState,
    Refresh,
    file_size_field,
    held_lists_field,
    window_end,
)
from shared.codec import RequestEntry, as_objects, as_written, dumps, loads
from shared.job_parameters import FieldNames
from shared.job_states import JobStatus
from shared.job_store import NewJob, now_ms
from shared.metrics import JOBS_SUBMITTED
from shared.model_repository import ModelConfig, client_named
from shared.problem_list import listed
from shared.tenant_index import Page
from shared.webhook_events import refusal

log = logging.getLogger(__name__)

BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")  # matched whole: `$` lets a trailing newline by
WINDOW = 256  # items looked at past each open head: micro-batches in flight finish out of order
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BatchNotFound(ConveyorError):
    """A batch that is not there (unknown, expired, or another tenant's): the Files API answers
    its output or errors file's 404 as the file's by this type, not by its message."""


def not_found(batch_id: str) -> BatchNotFound:
    return BatchNotFound(404, "not_found", f"batch {client_named(batch_id)} not found")


# OpenAI's codes for a line its batch never answered, having been cancelled or expired first
# (its error marked `by` the batch: a job cancelled alone, or past its line's own deadline, has
# the same status, and its error's own type as its code).
_NEVER_ANSWERED: dict[str, str] = {
    JobStatus.CANCELLED: "batch_cancelled",
    JobStatus.EXPIRED: "batch_expired",
}


# An item with its job.
Pending = tuple[lines.Item, NewJob]


def _split(
    items: list[lines.Item], jobs: list[NewJob], rooms: Mapping[str, int]
) -> tuple[list[Pending], list[Pending]]:
    """The items their lanes have room for now, the first ones in line order, and the rest."""
    left = dict(rooms)
    now: list[Pending] = []
    later: list[Pending] = []
    for item, job in zip(items, jobs, strict=True):
        fits = left.get(job.stream, 0) > 0
        left[job.stream] = left.get(job.stream, 0) - fits
        (now if fits else later).append((item, job))
    return now, later


def _line(record: dict[str, Any]) -> bytes:
    return dumps(record) + b"\n"


# Reads an uploaded file's bytes (`FilesService.data`): a batch's input named by `input_file_id`.
ReadFile = Callable[[str], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Asked:
    """A create as sent: its lines (the body, or a multipart upload's file), None where its
    options name an uploaded file instead; the options as given, not yet checked."""

    source: bytes | None
    options: dict[str, Any]

    def body_print(self) -> BodyPrint:
        """What a retry with the create's Idempotency-Key repeats: its options and lines (by
        digest), as sent, so that one refused now (its file deleted) still matches."""
        lines_sha = None if self.source is None else hashlib.sha256(self.source).hexdigest()
        return BodyPrint.of({"batch": self.options, "lines": lines_sha})


@dataclass(frozen=True, slots=True)
class Prepared:
    """A create checked, nothing stored yet."""

    options: BatchOptions
    parsed: lines.ParsedBatch
    window_s: int


def _new_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def _options(options: dict[str, Any]) -> BatchOptions:
    try:
        return BatchOptions.model_validate(options)
    except ValidationError as exc:
        errors = exc.errors()
        named = [".".join(map(client_named, e["loc"])) for e in errors]
        message = listed([f"{where}: {e['msg']}" for where, e in zip(named, errors, strict=True)])
        raise ConveyorError(422, "invalid_request", message, param=named[0]) from None


def _files_kept(options: BatchOptions) -> dict[str, int]:
    """The batch hash's `output_expires_after` (s), which its end (`BatchApiStore.finish`) and
    its files' objects read; none asked: no field (a result TTL)."""
    if (policy := options.output_expires_after) is None:
        return {}
    return {OUTPUT_EXPIRES_AFTER: policy.seconds}


async def _source(asked: Asked, options: BatchOptions, read_file: ReadFile) -> bytes:
    """The batch's lines: those sent, or the uploaded file's `input_file_id` names."""
    if options.input_file_id is None:
        return asked.source or b""
    if asked.source is not None:
        message = "input_file_id names the batch's lines: send it in a JSON body, not with a file"
        raise ConveyorError(422, "invalid_request", message)
    try:
        return await read_file(options.input_file_id)
    except ConveyorError as exc:
        if exc.status != 404:
            raise
        exc.param = "input_file_id"  # OpenAI's create: its SDK reads the field refused
        raise


class BatchApiService:
    def __init__(self, state: ProducerState, principal: Principal = ANONYMOUS) -> None:
        self.state = state
        self.progress = state.batch_progress
        self.store = state.batch_store
        self.principal = principal

    async def create(
        self, asked: Asked, read_file: ReadFile, key: str | None = None
    ) -> tuple[str, Refresh]:
        """A new batch of what was `asked` (its lines, or an uploaded file's that `read_file`
        reads); with an Idempotency-Key, as `/v1/jobs` takes one (`_create_once`)."""
        if key is not None:
            return await self._create_once(asked, read_file, key)
        prepared = await self._prepared(asked, read_file)
        batch_id = _new_id()
        return batch_id, await self._created(batch_id, prepared)

    async def _create_once(
        self, asked: Asked, read_file: ReadFile, key: str
    ) -> tuple[str, Refresh]:
        """A retry answers with the batch its first try created (its 202 lost), also when the
        request would be refused now (its input file deleted since, its model gone), as
        `JobsService._submit_once` answers with a job: a second batch ran every line again. A
        create that fails gives the key up, its batch withdrawn (`_withdraw`): the retry makes
        its own."""
        idempotency, tenant = self.state.idempotency, self.principal.tenant
        body_print = asked.body_print()
        try:
            prepared = await self._prepared(asked, read_file)
        except ConveyorError:
            if (
                first := await idempotency.used_for(tenant, key, body_print, self._started)
            ) is None:
                raise
            return first, await self._look(first)
        batch_id = _new_id()
        try:
            first = await idempotency.claim(tenant, key, batch_id, body_print, self._started)
            if first is None:
                async with idempotency.kept(tenant, key, batch_id, body_print) as hold:
                    created = await self._created(batch_id, prepared)
                if not hold.lost:
                    return batch_id, created
                # this create stalled past its claim's abandonment and a retry took the key
                # over, to make the batch it names: this one is a second, every line run twice
                await self._withdraw(batch_id, prepared.parsed.items)
                raise ConveyorError(
                    409,
                    "conflict",
                    "a retry with this Idempotency-Key took it over while this create stalled;"
                    " its batch was withdrawn: retry for the key's batch",
                    {"Retry-After": "1"},
                )
        except BaseException:
            await idempotency.release(tenant, key, batch_id)
            raise
        return first, await self._look(first)

    async def _started(self, batch_id: str) -> bool:
        """Whether the batch an Idempotency-Key was claimed for is there to answer with: past
        `validating`, as its create's 202 shows it. A retry waits for it until then, however
        long its create takes: the create keeps the claim young (`IdempotencyKeys.kept`), so
        only the claim of one whose producer died is taken over."""
        fields = await self.store.read(batch_id)
        return fields is not None and fields["status"] != BatchStatus.VALIDATING

    async def _prepared(self, asked: Asked, read_file: ReadFile) -> Prepared:
        """The create's options and lines checked, nothing stored: every refusal that does not
        depend on the bulk lane's room."""
        options = _options(asked.options)
        window_s = self._window_s(options.completion_window)
        if options.webhook is not None and (why := refusal(options.webhook, self.state.settings)):
            raise ConveyorError(422, "invalid_request", why, param="webhook")
        if options.model is not None:  # a model the key may not use: 403, as every route
            model_of(self.state, self.principal, options.model)  # (not a batch of refused lines)
        source = await _source(asked, options, read_file)
        parsed = await asyncio.to_thread(lines.parse, source, self._batch(options))
        if not parsed.items and not parsed.rejected:
            raise ConveyorError(422, "invalid_request", "the batch has no lines")
        return Prepared(options, parsed, window_s)

    async def _created(self, batch_id: str, prepared: Prepared) -> Refresh:
        """Enqueue a prepared batch's items the bulk lane has room for, hold the rest for the
        sweeper to feed as room frees (`feeding.py`), and start it; or withdraw what was
        written."""
        options, parsed, window_s = prepared.options, prepared.parsed, prepared.window_s
        rooms = await self._rooms(parsed.items)
        expires_ms = now_ms() + window_s * 1000
        meta: dict[str, str | int] = {
            "tenant": self.principal.tenant,
            "model": parsed.model or "",
            "endpoint": parsed.url or JOBS,
            **({"input_file_id": options.input_file_id} if options.input_file_id else {}),
            **({"metadata": dumps(options.metadata).decode()} if options.metadata else {}),
            **_files_kept(options),
            "completion_window": options.completion_window,
            "expires_at": expires_ms,
            "total": len(parsed.items) + len(parsed.rejected),
            **({"webhook": options.webhook} if options.webhook else {}),
        }
        ttl_s = window_s + self.state.settings.result_ttl_s
        created_at = await self.store.create(batch_id, meta, ttl_s)
        try:
            jobs = [self._job(batch_id, item, expires_ms, ttl_s) for item in parsed.items]
            now, later = _split(parsed.items, jobs, rooms)
            enqueued = await self._enqueue(batch_id, now)
            waiting = [p for p in now + later if p[1].entry.job_id not in enqueued]
            lanes, held = self._held(batch_id, sorted(waiting, key=lambda p: p[0].line))
            rejected = [dumps(r) for r in parsed.rejected]
            items = [(job.entry.job_id, enqueued.get(job.entry.job_id)) for job in jobs]
            await self.store.add_items(batch_id, items, rejected, ttl_s, list(held.items()))
            open_lists = sorted({self._open_list(batch_id, item) for item in parsed.items})
            invalid: dict[str, str | int] = {"invalid": len(rejected)}
            invalid.update(first_errors(parsed.rejected))
            fields = {**invalid, **held_lists_field(lanes)}
            kept_s = _files_kept(options).get(OUTPUT_EXPIRES_AFTER)
            await self.store.start(batch_id, open_lists, len(jobs), fields, expires_ms, kept_s)
            await self.store.enlist(self.principal.tenant, batch_id, created_at)
            progress = await self._look(batch_id)
        except BaseException:
            await self._withdraw(batch_id, parsed.items)
            raise
        if progress.fields["status"] == BatchStatus.FAILED:
            await self.progress.notify(batch_id, progress)
        return progress

    async def _withdraw(self, batch_id: str, items: list[lines.Item]) -> None:
        """A create that failed part-way (Redis failed, or with `CONVEYOR_REPLICA_ACKS` too few
        replicas confirmed a write: the client gets its 503 and no batch id) cancels the items
        it may have enqueued: they ran for a batch nobody could read, and the client's
        retry enqueued them again. A batch that had started ends cancelled too: left running,
        the sweeper would end it `completed`, every item cancelled. Its end is asked first, or
        a look in between would do just that. Best effort: a Redis that refuses this keeps
        them."""
        try:
            await self.progress.end(batch_id, BatchStatus.CANCELLED)
        except RedisError as exc:
            log.warning("batch %s could not be cancelled (%r)", batch_id, exc)
        job_ids = [item.entry.job_id for item in items]
        try:
            for start in range(0, len(job_ids), CHUNK):
                chunk = job_ids[start : start + CHUNK]
                await self.state.job_store.settle_many(chunk, JobStatus.CANCELLED, {})
        except RedisError as exc:
            log.warning("batch %s: its items could not be withdrawn (%r)", batch_id, exc)

    def _batch(self, options: BatchOptions) -> lines.ParsedBatch:
        """What a batch's lines are read into: each line's body as the route its url names
        reads it (the same checks), built into a job as `/v1/jobs` builds one."""
        openai = EmbeddingService(self.state, self.principal)
        readers: dict[str, lines.Reader] = {
            JOBS: lines.job_body,
            EMBEDDINGS: openai.embedding_line,
            CHAT: partial(openai.sampling_line, ChatCompletionRequest),
            COMPLETIONS: partial(openai.sampling_line, CompletionRequest),
        }
        settings = self.state.settings
        return lines.ParsedBatch(
            options.model,
            self._build,
            readers,
            settings.max_json_depth,
            settings.max_batch_lines,
            settings.max_body_bytes,
            options.endpoint,
        )

    def _build(
        self, model: str, body: PredictRequest, names: FieldNames
    ) -> tuple[RequestEntry, ModelConfig, str]:
        """A line's job, built as its route builds one: its refusals name the line's fields."""
        return JobsService(self.state, self.principal, names).build(model, body)

    def _window_s(self, window: str) -> int:
        seconds = int(window[:-1]) * _UNITS[window[-1]]
        longest = self.state.settings.result_ttl_s
        if seconds > longest:
            message = f"completion_window {window} is longer than the result TTL ({longest}s)"
            raise ConveyorError(422, "invalid_request", message, param="completion_window")
        return seconds

    async def _rooms(self, items: list[lines.Item]) -> dict[str, int]:
        """How many items each bulk lane the batch's items go to has room for now (XLEN
        against `queue.max_length`): those go in at create, the rest are held."""
        streams = sorted({self._stream(item) for item in items})
        if not streams:
            return {}
        limit = items[0].config.queue.max_length
        lengths = await self.store.lane_lengths(streams)
        return {
            stream: max(0, limit - length) for stream, length in zip(streams, lengths, strict=True)
        }

    def _stream(self, item: lines.Item) -> str:
        return self.state.keys.bulk_queue(item.config.name, item.variant)

    def _open_list(self, batch_id: str, item: lines.Item) -> str:
        return self.state.keys.batch_open(batch_id, item.config.name, item.variant)

    async def _enqueue(self, batch_id: str, items: list[Pending]) -> dict[str, str]:
        """Pipelined, CHUNK jobs per round trip; returns the open list of each job enqueued, by
        id (those a lane that filled up meanwhile refused are not: held instead)."""
        enqueued: dict[str, str] = {}
        round_trips, started = 0, time.perf_counter()
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            limit = chunk[0][0].config.queue.max_length
            full = set(await self.state.job_store.create_many([job for _, job in chunk], limit))
            round_trips += 1
            for index, (item, job) in enumerate(chunk):
                if index not in full:
                    JOBS_SUBMITTED.labels(item.config.name, item.variant, "bulk").inc()
                    enqueued[job.entry.job_id] = self._open_list(batch_id, item)
        elapsed_ms = (time.perf_counter() - started) * 1000
        message = "batch %s: %d jobs enqueued in %d round trips, %.0f ms"
        log.info(message, batch_id, len(enqueued), round_trips, elapsed_ms)
        return enqueued

    def _held(
        self, batch_id: str, items: list[Pending]
    ) -> tuple[list[HeldLane], dict[str, list[bytes]]]:
        """The held items' lanes and their entries by held list, in line order."""
        lanes: dict[str, HeldLane] = {}
        held: dict[str, list[bytes]] = {}
        for item, job in items:
            name, variant = item.config.name, item.variant
            key = self.state.keys.batch_held(batch_id, name, variant)
            if key not in lanes:
                limit = item.config.queue.max_length
                items_key = self._open_list(batch_id, item)
                lanes[key] = HeldLane(
                    key, items_key, job.stream, limit, name, variant, job.fair_window,
                    job.weight, job.ttl_s,
                )  # fmt: skip
            held.setdefault(key, []).append(lanes[key].entry(job))
        return list(lanes.values()), held

    def _job(self, batch_id: str, item: lines.Item, expires_ms: int, ttl_s: int) -> NewJob:
        """Batch items reply to nobody (no pub/sub per item) and expire with the batch, not
        before (`max_queue_time_s` is not theirs); their records live as long as the batch's,
        so the sweeper and the errors file find them when the window runs out."""
        entry = item.entry
        entry.reply = ""
        entry.batch = batch_id
        entry.batch_until = expires_ms
        entry.deadline_ms = min(entry.deadline_ms or expires_ms, expires_ms)
        fields: dict[str, str | int] = {
            "model": item.config.name,
            "variant": item.variant,
            "deadline": entry.deadline_ms,
            "batch": batch_id,
            "line": item.line,
            "custom_id": item.custom_id,
        }
        if webhook := entry.payload.get("webhook"):
            fields["webhook"] = webhook  # where a cancel or a dead letter finds it, as any job's
        stream = self._stream(item)
        fair_window = item.config.fair_window_of(item.variant)
        return NewJob(entry, stream, fields, fair_window, self.principal.weight, ttl_s)

    async def _look(self, batch_id: str) -> Refresh:
        if not BATCH_ID.fullmatch(batch_id):
            raise not_found(batch_id)
        progress = await self.progress.refresh(batch_id, WINDOW)
        if progress is None or progress.fields.get("tenant") != self.principal.tenant:
            raise not_found(batch_id)
        return progress

    async def get(self, batch_id: str) -> Refresh:
        return await self._look(batch_id)

    async def list(self, after: str | None, limit: int) -> Page[Refresh]:
        """The tenant's batches, newest first, from the one after `after`: up to `limit`, and
        whether more follow. A batch whose keys expired leaves the index once passed over."""
        return await self.store.page(self.principal.tenant, after, limit, self._listed_page)

    async def _listed_page(self, batch_ids: Sequence[str]) -> Sequence[Refresh | None]:
        return await asyncio.gather(*map(self._listed, batch_ids))

    async def _listed(self, batch_id: str) -> Refresh | None:
        """A listed batch, or None if its keys expired."""
        try:
            return await self._look(batch_id)
        except ConveyorError as exc:
            if exc.status == 404:
                return None
            raise

    async def cancel(self, batch_id: str) -> Refresh:
        """Cancel every item not yet finished (running ones included; their results are then
        discarded) and end the batch as `cancelled`. A 409 names the status the batch is in
        after the refusal (or the other end in force, while it runs): the one read before named
        `in_progress` for a batch that had ended meanwhile. One whose every item had ended
        before the cancel ends `completed` (`BatchApiStore.finish`), refused as a batch that
        had ended, not answered 200."""
        await self._look(batch_id)  # a batch of another tenant's is not found, never acted on
        in_force = await self.progress.end(batch_id, BatchStatus.CANCELLED)
        progress = await self._look(batch_id)
        ended = BatchStatus(progress.fields["status"])
        if in_force == BatchStatus.CANCELLED and ended != BatchStatus.COMPLETED:
            return progress
        status = in_force if in_force is not None and not ended.terminal else ended
        message = f"batch {batch_id} is {status.value}; cannot cancel"
        raise ConveyorError(409, "conflict", message)

    async def file(
        self, batch_id: str, kind: str, only_named: bool = False
    ) -> AsyncIterator[bytes]:
        """The lines of an ended batch's `output` or `errors` file (a 409 before it ends: a
        batch is completed, failed, cancelled or expired first; a 404 once it expired, and with
        `only_named` one its view does not name, `kept`)."""
        fields = await self.kept(batch_id, kind, only_named)
        return self._lines(batch_id, kind, fields)

    async def file_object(self, batch_id: str, kind: str) -> dict[str, Any]:
        """An ended batch's `output` or `errors` file as OpenAI's file object (purpose
        `batch_output`, made when the batch ended, kept as `_file_life` says): what OpenAI's
        SDK retrieves by the ids the batch gives; `bytes` is the length `file` serves."""
        fields = await self.kept(batch_id, kind, only_named=True)
        created_at, expires_at = self._file_life(batch_id, kind, fields)
        return {
            "id": f"{batch_id}-{kind}",
            "object": "file",
            "bytes": await self._file_size(batch_id, kind, fields),
            "created_at": created_at,
            "expires_at": expires_at,
            "filename": batch_file_name(batch_id, kind),
            "purpose": "batch_output",
            "status": "processed",
        }

    async def _file_size(self, batch_id: str, kind: str, fields: Mapping[str, str]) -> int:
        """The size of an ended batch's file: counted through the lines `file` serves once (a
        read of every item: 20,000 lines cost 20,000 Redis commands, on every retrieve), then
        kept in the batch hash, whose fields the retrieve reads anyway. An ended batch's lines
        no longer change; one whose hash has no size (ended before sizes were kept) is counted
        on its first retrieve."""
        field = file_size_field(kind)
        if field in fields:
            return int(fields[field])
        size = 0
        async for chunk in self._lines(batch_id, kind, fields):
            size += len(chunk)
        await self.store.set_field_unless_set(batch_id, field, str(size))
        return size

    def _file_life(self, batch_id: str, kind: str, fields: Mapping[str, str]) -> tuple[int, int]:
        """(created_at, expires_at) of an ended batch's file (s): made as the batch ended, kept
        for its `output_expires_after` (OpenAI's), the result TTL at most, as an upload is
        (`FileStore.expires_at`); its lines' keys expire then (`BatchApiStore.finish`), and a
        404 answers from then on, as for an expired upload, not an empty file."""
        created_at = int(fields.get(f"{fields['status']}_at", 0)) // 1000
        asked = fields.get(OUTPUT_EXPIRES_AFTER)
        expires_at = self.state.file_store.expires_at(created_at, int(asked) if asked else None)
        if now_ms() // 1000 >= expires_at:
            message = f"file {batch_id}-{kind} not found: it expired at {expires_at}"
            raise ConveyorError(404, "not_found", message)
        return created_at, expires_at

    async def kept(self, batch_id: str, kind: str, only_named: bool = False) -> Mapping[str, str]:
        """The batch's fields while its `output` or `errors` file is there: a 409 before the
        batch ends, a 404 once the file expired (its retrieve, content and delete alike). With
        `only_named` (the Files API's ids), a 404 too for a file its view does not name, as it
        holds no line, as OpenAI's for a file id that does not exist: it answered an empty
        file."""
        progress = await self.ended(batch_id)
        file_id = f"{batch_id}-{kind}"
        if only_named and file_id not in file_ids(batch_id, progress).values():
            message = f"file {file_id} not found: batch {batch_id} has no {kind} line"
            raise ConveyorError(404, "not_found", message)
        self._file_life(batch_id, kind, progress.fields)
        return progress.fields

    async def ended(self, batch_id: str) -> Refresh:
        """The batch's progress once it has ended (a 409 before)."""
        progress = await self._look(batch_id)
        status = BatchStatus(progress.fields["status"])
        if not status.terminal:
            message = f"batch {batch_id} is {status.value}; its files are ready when it ends"
            raise ConveyorError(409, "conflict", message)
        return progress

    def _lines(self, batch_id: str, kind: str, fields: Mapping[str, str]) -> AsyncIterator[bytes]:
        return self.output(batch_id, fields) if kind == "output" else self.errors(batch_id, fields)

    async def output(self, batch_id: str, fields: Mapping[str, str]) -> AsyncIterator[bytes]:
        """One line per succeeded item, in line order: `{id, custom_id, line, outputs}`; in a
        batch of lines for one of OpenAI's routes, OpenAI's `response` in place of `outputs`.
        An expired batch's results that came after its window are the errors file's."""
        render = _output
        if (endpoint := fields.get("endpoint", JOBS)) != JOBS:
            render = partial(_openai_output, endpoint, fields.get("model", ""))
        async for chunk in self.store.items(batch_id, window_end(fields["status"], fields)):
            yield b"".join(_line(render(item)) for item in chunk if item.status == "succeeded")

    async def errors(self, batch_id: str, fields: Mapping[str, str]) -> AsyncIterator[bytes]:
        """One line per line that did not succeed, in line order: `{custom_id, line, status,
        error: {type, message}}` (plus `id` for lines that became jobs); in a batch of lines for
        one of OpenAI's routes, OpenAI's `response` and `error.code` as well (`_openai_error`).
        An expired batch's results that came after its window are `expired` lines here."""
        endpoint = fields.get("endpoint", JOBS)
        render = partial(_openai_error, endpoint=endpoint) if endpoint != JOBS else dict
        rejected: list[dict[str, Any]] = []
        async for chunk in self.store.rejected(batch_id):
            rejected.extend(chunk)
        rejected.reverse()
        async for items in self.store.items(batch_id, window_end(fields["status"], fields)):
            out: list[bytes] = []
            for item in items:
                while rejected and int(str(rejected[-1]["line"])) < item.line:
                    out.append(_line(render(rejected.pop())))
                if item.status != "succeeded":
                    out.append(_line(render(_error(item))))
            yield b"".join(out)
        yield b"".join(_line(render(record)) for record in reversed(rejected))


def _output(item: ItemState) -> dict[str, Any]:
    return {
        "id": item.job_id,
        "custom_id": item.custom_id,
        "line": item.line,
        "outputs": as_written(item.outputs or b"null"),
    }


def _openai_output(endpoint: str, model: str, item: ItemState) -> dict[str, Any]:
    """OpenAI's output line: the answer the line's route would have given (a 502 for a model
    whose outputs are not what the route reads), with the job id as its request id."""
    try:
        status, body = 200, _answer(endpoint, model, item)
    except ConveyorError as exc:
        status, body = exc.status, {"error": {"type": exc.type, "message": exc.message}}
    return {
        "id": item.job_id,
        "custom_id": item.custom_id,
        "line": item.line,
        "response": {"status_code": status, "request_id": item.job_id, "body": body},
        "error": None,
    }


def _answer(endpoint: str, model: str, item: ItemState) -> Any:
    """What `endpoint` answers for the item's finished job; a completion's `created` is when
    its job finished, as OpenAI's is when the completion was made: dated as the output file
    was read, each download differed and its completions seemed made after the batch ended."""
    outputs = item.outputs or b"null"
    if endpoint == EMBEDDINGS:
        return embedding_list(model, as_written(outputs))
    renderer = (ChatRenderer if endpoint == CHAT else CompletionRenderer)(item.job_id, model)
    if item.finished is not None:
        renderer.created = item.finished // 1000
    generation = generation_of(model, loads(outputs))
    return renderer.response(generation).model_dump(mode="json")


def _openai_error(record: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """An errors-file line OpenAI's readers read too (its batch lines' shape, `{id, custom_id,
    response, error: {code, message}}`), keeping Conveyor's fields: a job that failed carries the
    `response` its route would have answered (the status `/predict` answers, the error as its
    body, the job id as request id); a line that never ran, or was cancelled or expired before
    it did, `response: null`, and when its batch's cancel or expiry stopped it (its error marked
    `by` the batch) OpenAI's `batch_cancelled` or `batch_expired` as its code. An input past the
    model's context is the route's 400 and its body (`job_failure`), as OpenAI's batch answers
    such a line: it was a 422."""
    error = as_objects(record["error"])
    status = str(record["status"])
    never_answered = _NEVER_ANSWERED.get(status) if error.get("by") == BY_BATCH else None
    error = {**error, "code": never_answered or error.get("type", status)}
    response = None
    if status == JobStatus.FAILED:
        failure = job_failure("job", status, error, _INPUT_FIELDS[endpoint])
        body = failure.as_openai().model_dump() if context_exceeded(error) else {"error": error}
        response = {"status_code": failure.status, "request_id": record["id"], "body": body}
    return {"id": None, **record, "response": response, "error": error}


# The field of each OpenAI route's body that holds what the model reads, which a refusal of its
# length names.
_INPUT_FIELDS: dict[str, str] = {
    CHAT: ChatRenderer.prompt,
    COMPLETIONS: CompletionRenderer.prompt,
    EMBEDDINGS: EMBEDDING_INPUT,
}


def _error(item: ItemState) -> dict[str, Any]:
    status = item.status or "expired"
    error: Any = {"type": status, "message": f"the job ended {status}"}
    if item.status is None:  # it went with the batch's keys: the batch never answered it
        error.update(message="the job's record expired", by=BY_BATCH)
    if item.error is not None:
        error = as_written(item.error)
    return {
        "id": item.job_id,
        "custom_id": item.custom_id,
        "line": item.line,
        "status": status,
        "error": error,
    }
