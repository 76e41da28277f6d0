"""Read-only views of jobs for the console, computed when a page asks (never per second): recent
jobs (the newest of each partition's lanes, of the jobs that ended in them and of its dead
letters: jobs have no time index, and a SCAN of the keyspace would not work on a cluster), one
job with its timeline, and its stream entry (inputs and trace context) while the job is still
queued (held back from a fair lane's stream too) or dead-lettered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from producer_api.state import ProducerState
from shared import job_scripts
from shared.codec import RequestEntry, as_text, dumps
from shared.job_store import JobRecord
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import unless_wrong_type
from shared.redis_client import RedisClient, queue_script, run_pipeline

READ_LIMIT = 5_000  # job hashes one listing reads at most
SHOWN = 100
ENTRY_SCAN = 2_000  # stream entries a job page reads at once
CLOCK_SKEW_MS = 5_000  # how far behind the producer's clock Redis's may be (entry ids)
PREVIEW_BYTES = 4_096
_LISTED = ("status", "model", "variant", "tenant", "created")


@dataclass(slots=True)
class Preview:
    """A JSON value as text, cut to PREVIEW_BYTES, with its full size."""

    text: str
    size: int
    truncated: bool

    @classmethod
    def of(cls, value: Any) -> Preview:
        raw = dumps(value)
        cut = raw[:PREVIEW_BYTES].decode(errors="replace")
        return cls(cut, len(raw), len(raw) > PREVIEW_BYTES)

    @classmethod
    def kept(cls, fields: dict[str, str]) -> Preview | None:
        """The inputs a worker kept in the hash of a job that did not succeed (already cut)."""
        if (text := fields.get("inputs")) is None:
            return None
        size = int(fields.get("inputs_size") or len(text))
        return cls(text, size, size > len(text.encode()))


@dataclass(slots=True)
class JobFilter:
    status: str = ""
    model: str = ""
    tenant: str = ""

    def admits(self, row: dict[str, str]) -> bool:
        return all(
            not wanted or row.get(name) == wanted
            for name, wanted in (
                ("status", self.status),
                ("model", self.model),
                ("tenant", self.tenant),
            )
        )


@dataclass(slots=True)
class Step:
    """One point of a job's timeline: when (unix s, None: not yet) and what it took."""

    label: str
    at: float | None
    note: str = ""


def _ms(value: float | None) -> str:
    return f"{value:.1f} ms" if value is not None else ""


def _timeline(view: dict[str, Any]) -> list[Step]:
    """submitted → read by a worker (queue wait) → ran in a micro-batch (size, engine time) →
    finished (total)."""
    timings = view["timings"]
    batch = view.get("batch_size")
    engine = _ms(timings.get("engine_ms"))
    queue_wait, total = _ms(timings.get("queue_wait_ms")), _ms(timings.get("total_ms"))
    return [
        Step("submitted", timings.get("created")),
        Step("read by a worker", timings.get("started"), queue_wait and f"waited {queue_wait}"),
        Step(
            "ran in a micro-batch",
            timings.get("finished") if batch is not None else None,
            f"batch of {batch}, engine {engine}" if batch is not None else "",
        ),
        Step("finished", timings.get("finished"), total and f"total {total}"),
    ]


@dataclass(slots=True)
class JobPage:
    record: JobRecord
    view: dict[str, Any]
    inputs: Preview | None = None
    outputs: Preview | None = None
    error: Preview | None = None
    trace_id: str = ""
    timeline: list[Step] = field(default_factory=list)


def _every_model(model: str) -> bool:
    return True


async def recent_jobs(
    client: RedisClient,
    keys: Keys,
    repository: ModelRepository,
    wanted: JobFilter,
    reaches: Callable[[str], bool] = _every_model,
) -> list[dict[str, str]]:
    """Up to SHOWN jobs matching `wanted`, newest first, of the models the viewer `reaches`
    (an admin key limited to some: a model it may not use lists nothing, as one that does not
    exist), among at most READ_LIMIT candidates (a console view, not an index: bounded cost on
    a large Redis). The job hashes are read with one pipeline, which a cluster client splits by
    node; a job key of another type (an operator's slip) leaves that job out, not the list."""
    configs = [c for c in repository if wanted.model in ("", c.name) and reaches(c.name)]
    ids = await _candidates(client, keys, configs)
    async with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hmget(keys.job(job_id), list(_LISTED))
        rows = await pipe.execute(raise_on_error=False)
    jobs = []
    for job_id, values in zip(ids, rows, strict=True):
        if isinstance(values, ResponseError):
            unless_wrong_type(values)
            continue
        row = {name: as_text(v) for name, v in zip(_LISTED, values, strict=True) if v is not None}
        if "status" in row and wanted.admits(row):
            jobs.append({"id": job_id, **row})
    jobs.sort(key=lambda row: int(row.get("created", "0")), reverse=True)
    return jobs[:SHOWN]


@dataclass(slots=True)
class _Sources:
    """Where a listing finds the ids of the newest jobs of some models' partitions: the lanes'
    and dead letters' streams, the lanes' lists of jobs that ended (`Keys.recent`) and the
    lanes' held jobs, in no stream yet. Every lane's held jobs are read, not only a fair one's:
    a lane whose `queue.fair` was switched off keeps its held jobs until they are refilled,
    and they were listed nowhere meanwhile (a lane that holds none costs one empty read)."""

    streams: list[str]
    ended: list[str]
    held: list[str]

    @classmethod
    def of(cls, keys: Keys, configs: list[ModelConfig]) -> _Sources:
        partitions = [(c.name, v) for c in configs for v in c.variants]
        lanes = [named(m, v) for m, v in partitions for named in (keys.queue, keys.bulk_queue)]
        streams = [*lanes, *(keys.dlq(m, v) for m, v in partitions)]
        return cls(streams, [keys.recent(lane) for lane in lanes], lanes)

    def __len__(self) -> int:
        return len(self.streams) + len(self.ended) + len(self.held)


async def _candidates(client: RedisClient, keys: Keys, configs: list[ModelConfig]) -> list[str]:
    """Ids of the newest jobs of every partition of `configs`: queued and running (the lanes'
    streams, and the jobs a fair lane held back per tenant, in no stream yet), ended there
    (`Keys.recent`) and dead letters, READ_LIMIT shared evenly among these sources (at least
    one id each: READ_LIMIT in all up to a thousand partitions); one pipeline of reads of one
    slot each. A model one of whose keys is of another type (an operator's slip) is left out,
    as the Overview leaves it out: it refused the read of them all, the Jobs list a 500."""
    everywhere = _Sources.of(keys, configs)
    each = max(1, READ_LIMIT // max(len(everywhere), 1))
    ids = await _ids_in(client, everywhere, each)
    if ids is None:  # read again a model at a time, to leave out only those refused
        read = [await _ids_in(client, _Sources.of(keys, [c]), each) for c in configs]
        ids = [job_id for model_ids in read for job_id in model_ids or ()]
    return list(dict.fromkeys(ids))


async def _ids_in(client: RedisClient, sources: _Sources, each: int) -> list[str] | None:
    """Up to `each` ids from each of `sources`, or None where a key of them is of another
    type."""
    held = client.register_script(job_scripts.HELD_IDS)

    async def fill(pipe: Any) -> None:
        for stream in sources.streams:
            pipe.xrevrange(stream, count=each)
        for ended in sources.ended:
            pipe.lrange(ended, 0, each - 1)
        for lane in sources.held:
            queue_script(pipe, held, [lane], [each])

    try:
        _, replies = await run_pipeline(client, fill, [held])
    except ResponseError as refused:
        unless_wrong_type(refused)
        return None
    entries: list[Any] = replies[: len(sources.streams)]
    listed: list[Any] = replies[len(sources.streams) :]  # ended, then held
    ids = [as_text(fields[b"id"]) for rows in entries for _, fields in rows if b"id" in fields]
    return ids + [as_text(job_id) for rows in listed for job_id in rows]


async def find_entry(state: ProducerState, record: JobRecord) -> RequestEntry | None:
    """The job's entry in the lane its hash names or in its partition's dead letters (the job
    hash keeps inputs only for jobs that did not succeed, cut to 4 KiB). An entry is added at
    the job's creation or later (a fair lane's held job, a dead letter), so each stream is read
    from the job's `created` less the hosts' clock skew, however deep the job is queued: up to
    the partition's `queue.max_length` entries (a lane never holds more), ENTRY_SCAN a read."""
    fields = record.fields
    model = fields.get("model", "")
    dlq = state.keys.dlq(model, fields.get("variant", ""))
    config = state.repository.get(model)
    most = config.queue.max_length if config is not None else ENTRY_SCAN
    start = f"{max(0, int(fields.get('created') or 0) - CLOCK_SKEW_MS)}-0"
    lane = fields.get("stream")
    if lane and fields.get("held"):  # held back from a fair lane: in its tenant's list
        tenant = fields.get("tenant", "default")
        held = await _held_entry(state.redis, state.keys.held(lane, tenant), record.job_id, most)
        if held is not None:
            return _decoded(held)
    for stream in (name for name in (lane, dlq) if name):
        if (entry := await _entry_in(state.redis, stream, start, record.job_id, most)) is not None:
            return _decoded(entry)
    return None


def _decoded(fields: dict[bytes, bytes]) -> RequestEntry | None:
    """The entry as a job; None for one no producer writes (a payload that is no JSON object,
    which a worker fails its job for, keeping the inputs in its hash): its page was a 500."""
    try:
        return RequestEntry.decode(fields)
    except (KeyError, ValueError):
        return None


async def _held_entry(
    client: RedisClient, held: str, job_id: str, most: int
) -> dict[bytes, bytes] | None:
    """The fields of `job_id`'s entry in a tenant's `held` list, looked for ENTRY_SCAN entries
    a call (one call unpacking a whole list would hold the server that long), up to `most`
    entries (a lane never holds more). One moved into the stream meanwhile is found there."""
    script = client.register_script(job_scripts.HELD_ENTRY)
    for first in range(0, most, ENTRY_SCAN):
        last = min(first + ENTRY_SCAN, most) - 1

        async def fill(pipe: Any, first: int = first, last: int = last) -> None:
            queue_script(pipe, script, [held], [job_id, first, last])

        _, [found] = await run_pipeline(client, fill, [script])
        if isinstance(found, list):
            return dict(zip(found[::2], found[1::2], strict=True))
        if int(found) < last - first + 1:  # the list ended
            return None
    return None


async def _entry_in(
    client: RedisClient, stream: str, start: str, job_id: str, most: int
) -> dict[bytes, bytes] | None:
    """The fields of `job_id`'s entry in `stream`, read on from `start` a page at a time (one
    read of ENTRY_SCAN missed it behind a burst of more jobs in the skew margin before it), up
    to `most` entries; none in a key of another type (an operator's slip: a 500)."""
    wanted = job_id.encode()
    while most > 0:
        count = min(ENTRY_SCAN, most)
        try:
            rows: Any = await client.xrange(stream, min=start, count=count)
        except ResponseError as refused:
            unless_wrong_type(refused)
            return None
        found: dict[bytes, bytes] | None = next(
            (entry for _, entry in rows if entry.get(b"id") == wanted), None
        )
        if found is not None or len(rows) < count:
            return found
        most -= count
        start = f"({rows[-1][0].decode()}"
    return None


def _trace_id(traceparent: str) -> str:
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else ""


async def job_page(state: ProducerState, record: JobRecord) -> JobPage:
    view = record.view(history=True)  # an operator asks which worker did what
    page = JobPage(record, view)
    page.timeline = _timeline(view)
    if "outputs" in view:
        page.outputs = Preview.of(view["outputs"])
    if "error" in view:
        page.error = Preview.of(view["error"])
    if (entry := await find_entry(state, record)) is not None:
        page.inputs = Preview.of(entry.payload)
        page.trace_id = _trace_id(entry.traceparent)
    else:  # the entry is gone once the job ran: what the worker kept in the hash
        page.inputs = Preview.kept(record.fields)
        page.trace_id = _trace_id(record.fields.get("traceparent", ""))
    return page
