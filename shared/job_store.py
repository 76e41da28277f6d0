"""Job hashes (`Keys.job`): create with the stream entry in one transaction, read, and move
through the state machine atomically; the producer and the workers share this module. A job
that ends gives back its API key's in-flight slot here too (shared/rate_limit.queue_slot_frees):
the set lives in the key's slot, not the job's, so it is freed beside the script that ends it."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis._parsers.base import BaseParser
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from shared import job_scripts
from shared.codec import RequestEntry, as_text, as_written, dumps, loads
from shared.job_states import IllegalTransition, JobStatus
from shared.keys import GROUP, Keys
from shared.metrics import JOBS_FINISHED
from shared.rate_limit import queue_slot_frees
from shared.redis_client import (
    MergedCall,
    RedisClient,
    ScriptCall,
    call_script,
    check_replica_acks,
    hgetall_many,
    queue_replica_wait,
    queue_script,
    run_pipeline,
    run_script,
)
from shared.redis_clock import CLOCK
from shared.settings import get_settings

log = logging.getLogger(__name__)
_TIMING_FIELDS = ("queue_wait_ms", "engine_ms", "ttft_ms", "tpot_ms")
# A random token a terminal move of the API writes: which call made it (`_made_by`).
ENDED_BY = "ended_by"
_COUNT_FIELDS = ("batch_size", "attempts", "prompt_tokens", "completion_tokens")
_ATTEMPT_FIELDS = ("consumer", "host", "pid", "started", "ended", "outcome", "error")


def now_ms() -> int:
    """Redis's clock as this host reads it (shared/redis_clock.py), in ms: what one host stamps
    on a job, another judges."""
    return CLOCK.now_ns() // 1_000_000


def stamp_ms() -> float:
    """Redis's clock as this host reads it in ms to the µs, for the ends of a job's queue wait:
    on a GPU a micro-batch, and so a wait behind one, takes a fraction of a millisecond."""
    return CLOCK.now_ns() // 1_000 / 1_000


def job_view(
    job_id: str,
    fields: Mapping[str, str | bytes],
    history: bool = False,
    spliced: bool = False,
) -> dict[str, Any]:
    """The public shape of a job (`{id, status, model, variant, outputs?, error?, timings}`),
    built the same way from a hash read and from a worker's reply message; with `history`, also
    its `attempt_history` (asked for, since it grows with every redelivery). `spliced`: the
    outputs stay the text the worker stored (`as_written`), for a view that is only written
    out: a poll of a finished job's embeddings parsed and rewrote megabytes of numbers."""
    get = {k: as_text(v) for k, v in fields.items()}.get
    view: dict[str, Any] = {
        "id": job_id,
        "status": get("status"),
        "model": get("model"),
        "variant": get("variant"),
    }
    if (outputs := get("outputs")) is not None:
        view["outputs"] = as_written(outputs) if spliced else loads(outputs)
    if (error := get("error")) is not None:
        view["error"] = loads(error)
    timings: dict[str, Any] = {}
    for name in ("created", "started", "finished"):
        if (stamp := get(name)) is not None:
            timings[name] = int(stamp) / 1000.0
    for name in _TIMING_FIELDS:
        if (value := get(name)) is not None:
            timings[name] = float(value)
    if "finished" in timings and "created" in timings:
        # never below 0: `created` is the producer's clock, `finished` the worker's, and a
        # worker's running behind read a quick job's total as minus the skew
        total_s = max(0.0, timings["finished"] - timings["created"])
        timings["total_ms"] = round(total_s * 1000.0, 3)
    view["timings"] = timings
    if replay_of := get("replay_of"):
        view["replay_of"] = replay_of
    for name in _COUNT_FIELDS:
        if (value := get(name)) is not None:
            view[name] = int(value)
    if history:
        view["attempt_history"] = [_attempt(run) for run in loads(get("attempt_history") or "[]")]
    return view


def attempt_json(
    consumer: str, started: str | None, ended: str | None, outcome: str, error: str | None
) -> bytes:
    """One attempt of a job's history as the Lua scripts' `attempt` encodes it (who ran it: the
    consumer `{host}-{pid}`, split; from when to when, ms; how it ended; the error's JSON), for a
    worker to send with its result: built here, FINISH only appends it (encoding it in Lua was
    a tenth of the server's CPU per job)."""
    host, _, pid = consumer.rpartition("-")
    run: dict[str, Any] = {"consumer": consumer}
    if host and pid.isascii() and pid.isdigit():  # as Lua's %d+
        run |= {"host": host, "pid": int(pid)}
    if started is not None:
        run["started"] = int(started)
    if ended is not None:
        run["ended"] = int(ended)
    run["outcome"] = outcome
    if error is not None:
        run["error"] = loads(error)
    return dumps(run)


def _attempt(run: dict[str, Any]) -> dict[str, Any]:
    """One attempt as the Lua scripts record it (`job_scripts.attempt`, whose JSON keys come in
    no set order), in a fixed order with times in seconds like the job's timings."""
    shown = {name: run[name] for name in _ATTEMPT_FIELDS if name in run}
    for name in ("started", "ended"):
        if name in shown:
            shown[name] = shown[name] / 1000.0
    return shown


@dataclass(slots=True)
class JobRecord:
    job_id: str
    fields: dict[str, str]

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.fields["status"])

    def view(self, history: bool = False, spliced: bool = False) -> dict[str, Any]:
        return job_view(self.job_id, self.fields, history, spliced)


@dataclass(slots=True)
class NewJob:
    """One job to enqueue: its stream entry, the partition stream, extra job-hash fields, for
    a fair lane its window (`queue.fair_window`; 0: not fair) and the tenant's weight (None: not
    known, as for a dead letter's replay: the weight recorded for the tenant stands), and how
    long its hash lives unless it ends sooner (0: the store's TTL; a Batch API item's outlives
    its batch's window). Ending a job only ever lengthens its hash's life. `may_exist`: its id
    may have been enqueued before (a dead letter's replay id), so its hash is looked for first
    in any call (ENQUEUE looks for one per call otherwise, to tell a rerun)."""

    entry: RequestEntry
    stream: str
    fields: Mapping[str, str | int]
    fair_window: int = 0
    weight: float | None = 1.0
    ttl_s: int = 0
    may_exist: bool = False


def _record(job_id: str, raw: Mapping[Any, Any]) -> JobRecord | None:
    """A job hash as read (no fields: no such job)."""
    if not raw:
        return None
    return JobRecord(job_id, {as_text(k): as_text(v) for k, v in raw.items()})


class JobNotFound(LookupError):
    pass


class QueueFull(Exception):
    """The partition is at its `max_length` (queued plus in flight): admission refused."""

    def __init__(self, stream: str, length: int) -> None:
        super().__init__(f"{stream} holds {length} entries")
        self.stream = stream
        self.length = length


class TooFarBack(Exception):
    """More entries wait ahead in the lane than the job's deadline leaves time for."""

    def __init__(self, stream: str, ahead: int) -> None:
        super().__init__(f"{stream} has {ahead} entries ahead")
        self.stream = stream
        self.ahead = ahead


# A job written back within this share of the result TTL (a minute at most) of its creation
# keeps the TTL its enqueue set rather than having it renewed: an EXPIRE fewer per job, for a
# result kept `ttl_s` after its end give or take that much (and clocks' skew between hosts).
RENEW_SLACK_SHARE, RENEW_SLACK_MAX_MS = 0.1, 60_000


def renew_before_ms(ttl_s: int, now: int) -> int:
    """FINISH's `renew_before`: the jobs created before it get their hash's TTL renewed."""
    return now - int(min(ttl_s * 1000 * RENEW_SLACK_SHARE, RENEW_SLACK_MAX_MS))


# ENQUEUE's reply code for a job one of whose commands failed (`{-1, the error}`): it fails
# alone, its call's other jobs have their own replies.
ENQUEUE_FAILED = -1


def _enqueued(reply: Sequence[Any]) -> Sequence[Any]:
    """One job's ENQUEUE reply, or its error raised as redis-py raises a call's (its class by
    its code: a key whose slot moved mid-migration is an outage, a wrong type a ResponseError)."""
    if reply[0] == ENQUEUE_FAILED:
        raise BaseParser.parse_error(as_text(reply[1]))
    return reply


# Jobs per ENQUEUE call at most: a script holds the server for its whole run (~10 us a job).
ENQUEUE_JOBS = 64
# An ENQUEUE call's keys and arguments before its jobs': what the jobs of one call share.
_SHARED_KEYS, _HEAD = 2, 6


def merged_enqueues(calls: Sequence[ScriptCall]) -> list[MergedCall]:
    """ENQUEUE calls of one lane (one stream, max_length and fair window) as one call of all
    their jobs, of ENQUEUE_JOBS calls at most (a create's carries one job): how a
    group-committing client sends the creates of one event-loop turn
    (producer_api/jobs/group_commit.py), and `create_many` its jobs. Each job is still
    admitted as if it came alone, and fails alone (a key of the wrong type: `_enqueued`); the
    call, its prelude and reading the lane's length are paid once."""
    lanes: dict[tuple[Any, ...], list[int]] = {}
    for index, (keys, args) in enumerate(calls):
        lanes.setdefault((*keys[:_SHARED_KEYS], *args[:_HEAD]), []).append(index)
    merged: list[MergedCall] = []
    for indexes in lanes.values():
        for start in range(0, len(indexes), ENQUEUE_JOBS):
            chunk = indexes[start : start + ENQUEUE_JOBS]
            keys, args = calls[chunk[0]]
            keys, args = list(keys[:_SHARED_KEYS]), list(args[:_HEAD])
            for index in chunk:
                keys += calls[index][0][_SHARED_KEYS:]
                args += calls[index][1][_HEAD:]
            parts = [(index, len(calls[index][0]) - _SHARED_KEYS) for index in chunk]
            merged.append(((keys, args), parts))
    return merged


class JobStore:
    """Every read and write of job hashes goes through here (or the worker's batch scripts)."""

    def __init__(self, client: RedisClient, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        # each lane's floor, as ENQUEUE last read it (job_scripts' below_bound): handed back,
        # it spares a submit-and-wait's call the read of the lane's length while far from full
        self._floors: dict[str, int] = {}
        self._transition = client.register_script(job_scripts.TRANSITION)
        self._enqueue = client.register_script(job_scripts.ENQUEUE)

    async def create(
        self,
        entry: RequestEntry,
        stream: str,
        fields: Mapping[str, str | int],
        max_length: int = 0,
        max_ahead: int = -1,
        fair: tuple[int, float | None] = (0, 1.0),
        may_exist: bool = False,
        ttl_s: int = 0,
    ) -> int:
        """Write the queued job and append its entry atomically (never one alone), unless the
        partition already holds `max_length` entries (QueueFull) or more than `max_ahead` (if
        not -1) wait undelivered in the lane (TooFarBack): then write nothing. Returns the
        number of entries ahead of the job: its queue position, from the same round trip;
        -1, not counted, on a plain lane for `max_ahead` UNPLACED (any number may wait, and
        the caller shows no position: the call reads no pending count).
        `fair`: (window, tenant weight) of a fair lane, whose job may be held (NewJob);
        `may_exist`: the id may have been enqueued before (NewJob); `ttl_s`: the record's
        TTL, 0 for the store's (NewJob).
        On the producer's group-committing client the creates of one lane in one event-loop
        turn share one script call (`merged_enqueues`), each job admitted as if it came alone."""
        job = NewJob(entry, stream, fields, *fair, ttl_s=ttl_s, may_exist=may_exist)
        _, ahead = await self.enqueue_through(self._enqueue, job, max_length, max_ahead)
        return ahead

    async def enqueue_through(
        self,
        script: AsyncScript,
        job: NewJob,
        max_length: int,
        max_ahead: int = -1,
        extra: ScriptCall = ([], []),
    ) -> tuple[int, int]:
        """Run `job`'s ENQUEUE call (`enqueue_call`) through `script`, ENQUEUE or one built
        around its body (REPLAY_LETTER) with its own keys and arguments after ENQUEUE's
        (`extra`), and read the reply: QueueFull or TooFarBack where the lane refused the job,
        else (its reply code, 1 for admitted or the wrapping script's own; its count)."""
        keys, args = self.enqueue_call(job, max_length, max_ahead)
        [reply] = await call_script(script, keys + extra[0], args + extra[1])
        admitted, count, *_ = self._lane_reply(job.stream, reply)
        if admitted == 0:
            raise QueueFull(job.stream, int(count))
        if admitted == 2:
            raise TooFarBack(job.stream, int(count))
        return int(admitted), int(count)

    def ttl_until(self, deadline_ms: int) -> int:
        """The TTL of a job that may wait until `deadline_ms` (a batch item, to its window's
        end) and then keeps its result the store's TTL: its record outlives its wait."""
        return max(0, math.ceil((deadline_ms - now_ms()) / 1000)) + self.ttl_s

    async def create_many(self, jobs: Sequence[NewJob], max_length: int = 0) -> list[int]:
        """`create` for many jobs in one pipelined round trip (each job still admitted and
        enqueued atomically; their calls merged as `merged_enqueues` merges them); returns the
        indexes of the jobs refused because their partition was full. With
        `CONVEYOR_REPLICA_ACKS` the round trip ends with WAIT on each master written, as group
        commit's does (ReplicaAckTimeout when too few replicas confirm): a Batch API 202 rests on
        these jobs. A rerun after NOSCRIPT sends every call again, which ENQUEUE tells apart.
        A job ENQUEUE could not write raises its error (`_enqueued`); the others stay written."""
        merged = merged_enqueues(
            [self.enqueue_call(job, max_length, job_scripts.UNPLACED) for job in jobs]
        )

        async def fill(pipe: Any) -> int:
            for (keys, args), _ in merged:
                queue_script(pipe, self._enqueue, keys, args)
            streams = [keys[0] for (keys, _args), _ in merged]
            return await queue_replica_wait(self.redis, pipe, streams)

        _, replies = await run_pipeline(self.redis, fill, [self._enqueue])
        check_replica_acks(replies[len(merged) :])  # the WAITs' replies, if any
        refused = [
            index
            for ((keys, _), parts), lane in zip(merged, replies[: len(merged)], strict=True)
            for (index, _), (admitted, *_) in zip(
                parts, [self._lane_reply(keys[0], reply) for reply in lane], strict=True
            )
            if not admitted
        ]
        return sorted(refused)

    def enqueue_call(self, job: NewJob, max_length: int, max_ahead: int = -1) -> ScriptCall:
        """One job's ENQUEUE call (`max_ahead` -1: any number of entries may be ahead of it;
        UNPLACED: so too, and its position is not read from the reply)."""
        entry, stream = job.entry, job.stream
        mapping: dict[str, str | int] = {
            **job.fields,
            "status": JobStatus.QUEUED.value,
            "created": int(entry.enqueued_ms),
            "reply": entry.reply,
            "tenant": entry.tenant,
        }  # and `stream`, where its queue position is read, which ENQUEUE writes from its key
        # the deadline only when set, as `encode` leaves it out of the entry: a `deadline: 0`
        # cost every job without one a field; every release's reader reads a missing one as none
        if entry.deadline_ms:
            mapping["deadline"] = entry.deadline_ms
        encoded = entry.encode()
        keys = [stream, self.keys.added(stream), self.keys.job(entry.job_id)]  # _SHARED_KEYS, 1
        ttl_s = job.ttl_s or self.ttl_s
        floor = self._floors.get(stream, "")
        args: list[Any] = [max_length, ttl_s, GROUP, job.fair_window, self.keys.job_prefix, floor]
        weight = "" if job.weight is None else job.weight
        args += [max_ahead, weight, len(mapping), len(encoded), int(job.may_exist)]
        args += [part for pair in mapping.items() for part in pair]
        args += [part for pair in encoded.items() for part in pair]
        return keys, args

    def _lane_reply(self, stream: str, reply: Sequence[Any]) -> Sequence[Any]:
        """`_enqueued`, keeping the lane's floor where the reply tells one."""
        if len(_enqueued(reply)) > 3:
            self._floors[stream] = int(reply[3])
        return reply

    async def get(self, job_id: str) -> JobRecord | None:
        return _record(job_id, await self.redis.hgetall(self.keys.job(job_id)))

    async def exists(self, job_id: str) -> bool:
        return bool(await self.redis.exists(self.keys.job(job_id)))

    async def get_many(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        """The jobs' records in one round trip (a cluster pipeline is split per node)."""
        raws = await hgetall_many(self.redis, [self.keys.job(job_id) for job_id in job_ids])
        return [_record(job_id, raw) for job_id, raw in zip(job_ids, raws, strict=True)]

    async def transition(
        self, job_id: str, target: JobStatus, fields: Mapping[str, str | int] | None = None
    ) -> JobRecord:
        """Move a job to `target` if the state machine allows it, then tell its waiters. A move
        whose reply was lost and that the client reran (the rerun finds the job at `target`
        already) is still this call's, known by the `ended_by` token it wrote: it answered 409
        "already cancelled", and the cancel's webhook was never sent. (Its `finished` stamp
        told two cancels of one millisecond apart from neither: both answered 200.)

        With `CONVEYOR_REPLICA_ACKS` the move ends with WAIT on the job's master
        (ReplicaAckTimeout when too few replicas confirm: the API's 503) and its waiters hear of
        it only then, as a worker's FINISH defers its replies: a cancel TRANSITION published
        itself was answered and announced before any replica held it, and a failover brought
        the job back `queued`, to run."""
        record = await self.get(job_id)
        if record is None:
            raise JobNotFound(job_id)
        extra: dict[str, str | int] = {**(fields or {})}
        if target.terminal:
            extra = {"finished": now_ms(), ENDED_BY: uuid.uuid4().hex[:16], **extra}
        message = dumps(job_view(job_id, {**record.fields, **_strs(extra), "status": target}))
        flat = [str(part) for pair in extra.items() for part in pair]
        reply = record.fields.get("reply", "")
        published = "" if get_settings().replica_acks else reply  # else `_announce`, once held
        args = [target.value, published, message, self.ttl_s, job_id, *flat]
        inflight = record.fields.get("inflight", "")

        async def fill(pipe: Any) -> int:
            queue_script(pipe, self._transition, [self.keys.job(job_id)], args)
            if target.terminal:  # ZREM is idempotent: a job that had ended is no longer held
                queue_slot_frees(pipe, [(inflight, job_id)])
            return await queue_replica_wait(self.redis, pipe, [self.keys.job(job_id)])

        waits, replies = await run_pipeline(self.redis, fill, [self._transition])
        ok, before, *_ = replies[0]
        _count_withdrawn(target, replies[:1])
        updated = await self.get(job_id)
        if updated is None or (not ok and not before):  # gone (expired, lost) since the read
            raise JobNotFound(job_id)
        if not ok and not _made_by(updated, target, extra):
            raise IllegalTransition(job_id, as_text(before), target.value)
        if waits:
            check_replica_acks(replies[len(replies) - waits :])
            await self._announce(reply, message)
        return updated

    async def _announce(self, channel: str, message: bytes) -> None:
        """TRANSITION's SPUBLISH of a move, sent once replicas hold it. On a pipeline: a group
        commit client would WAIT for the publish as for a write. A publish that fails is only
        logged: the move stands, and each waiter reads the job when its wait ends."""
        if not channel:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.spublish(channel, message)
                await pipe.execute()
        except RedisError as exc:
            log.warning("the move of a job was not announced on %s: %r", channel, exc)

    async def settle_many(
        self, job_ids: Sequence[str], target: JobStatus, fields: Mapping[str, str | int]
    ) -> int:
        """Move many jobs that nobody waits on (no reply channel, e.g. batch items) to a
        terminal `target` in one pipelined round trip; jobs already terminal stay as they are.
        Returns how many moved."""
        flat = [str(part) for pair in {"finished": now_ms(), **fields}.items() for part in pair]
        calls = [
            ([self.keys.job(job_id)], [target.value, "", "", self.ttl_s, job_id, *flat])
            for job_id in job_ids
        ]
        replies = await run_script(self.redis, self._transition, calls)
        _count_withdrawn(target, replies)
        return sum(1 for ok, *_ in replies if ok)


def _count_withdrawn(target: JobStatus, replies: Sequence[Sequence[Any]]) -> None:
    """Count the ends of the jobs whose entries TRANSITION withdrew: no worker reads them, and a
    worker counted a job the API ended while queued when it read the entry. A rerun of the
    call (its reply lost) says what its first run withdrew: counted, as the first run's was
    not."""
    for _ok, _before, *withdrawn in replies:
        if withdrawn and withdrawn[0] == 1:
            model, variant = as_text(withdrawn[1]), as_text(withdrawn[2])
            JOBS_FINISHED.labels(model, variant, target.value).inc()


def _made_by(record: JobRecord | None, target: JobStatus, written: Mapping[str, str | int]) -> bool:
    """Whether `record` is at `target` with the token this call wrote (a terminal move's)."""
    token = written.get(ENDED_BY)
    return (
        record is not None
        and record.status == target
        and token is not None
        and record.fields.get(ENDED_BY) == token
    )


def _strs(fields: Mapping[str, str | int]) -> dict[str, str]:
    return {k: str(v) for k, v in fields.items()}
