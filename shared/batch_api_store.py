"""Batch API batches in Redis (not the workers' micro-batches): a hash per batch (metadata,
counters, webhook log), the item job ids in line order, the lines refused at submit, and per
partition the batch's item ids in stream order (and its items the partition's bulk lane had no
room for yet, `HeldLane`), which the hash holds a cursor into: finished
items are counted from the cursor on, so progress costs work proportional to what changed, not
to the batch's size. The per-partition lists live in their partitions' slots, everything else in
the batch's, the active index in the control plane's (shared/keys.py); no script or transaction
spans two of them (shared/batch_api_scripts.py says how counting stays exact)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import chain
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from shared import batch_api_scripts
from shared.batch_api_scripts import ITEM_STATES, BatchStatus
from shared.codec import RequestEntry, as_text, dumps, loads
from shared.file_expiry import file_expiry
from shared.job_states import JobStatus
from shared.job_store import NewJob, now_ms
from shared.keys import Keys
from shared.redis_client import (
    check_replica_acks,
    queue_replica_wait,
    queue_script,
    run_pipeline,
)
from shared.tenant_index import TenantIndexed

CHUNK = 500
BUDGET = 4 * CHUNK  # items one COUNT call may count: bounds how long it holds its server
STALE_MS = 60_000  # a finalizer silent this long is replaced
ENDED_KEPT_MS = 600_000  # how long an ended batch stays in the ended index (the console's)


# Why an item has no result when its batch's cancel or expiry stopped it (its error's message).
ENDED_EARLY = {
    BatchStatus.CANCELLED: "the batch was cancelled before this job finished",
    BatchStatus.EXPIRED: "the batch's completion window ended before this job finished",
}
# The states a result (a worker's, or a dead letter's) ends an item in.
_RESULTS = frozenset({JobStatus.SUCCEEDED.value, JobStatus.FAILED.value})
# The states a batch's cancel or expiry ends an item in.
_STOPPED = frozenset(ending.value for ending in ENDED_EARLY)


# The batch hash's field of OpenAI's `output_expires_after.seconds`: how long its output and
# error files are kept from its end (`file_expiry`), where not the result TTL.
OUTPUT_EXPIRES_AFTER = "output_expires_after"


def file_size_field(kind: str) -> str:
    """The batch hash's field of its ended `output` or `errors` file's size (bytes), kept at the
    file's first retrieve: its lines no longer change once the batch ended."""
    return f"{kind}_bytes"


# Marks the error of an item its batch's own end stopped (`by`), not its own cancel or deadline.
BY_BATCH = "batch"


def ended_early(ending: BatchStatus) -> bytes:
    """The error (JSON) of an item that its batch's cancel or expiry stopped, marked so: an
    item cancelled alone, or expired by its line's own deadline, has the same status."""
    return dumps({"type": ending.value, "message": ENDED_EARLY[ending], "by": BY_BATCH})


def window_end(status: str, fields: Mapping[str, str]) -> int | None:
    """Until when (ms) a result is the batch's: an expired batch's `expires_at`, as OpenAI's
    expired batch answers only what completed before it expired; None (whenever) for any other."""
    if status != BatchStatus.EXPIRED or "expires_at" not in fields:
        return None
    return int(fields["expires_at"])


def _checked_until(status: BatchStatus, fields: Mapping[str, str]) -> int | None:
    """Until when a result is the batch's, as its finalizer checks: `window_end`, and for a
    batch heading to `completed` once its window has ended, that window's end as well."""
    if status != BatchStatus.COMPLETED:
        return window_end(status, fields)
    until = window_end(BatchStatus.EXPIRED, fields)
    return until if until is not None and now_ms() >= until else None


def _flat(fields: Mapping[str, str | int]) -> list[EncodableT]:
    return [part for pair in fields.items() for part in pair]


def _fields(flat: Sequence[str | bytes]) -> dict[str, str]:
    return {as_text(flat[i]): as_text(flat[i + 1]) for i in range(0, len(flat), 2)}


def open_lists(fields: Mapping[str, str]) -> list[str]:
    """A batch's per-partition item lists, in the order their cursors (`at:<index>`) number."""
    lists: list[str] = loads(fields.get("open_lists") or "[]")
    return lists


@dataclass(frozen=True, slots=True)
class HeldLane:
    """Where a batch's items its bulk lane had no room for at create wait (`held`, in line
    order) and how they are enqueued as room frees: into `stream`, never past `limit` (its
    `queue.max_length` at create, so every producer that feeds it keeps the same bound), with
    the create's fair window, weight and TTL, recorded in `items` (the partition's item list)."""

    held: str
    items: str
    stream: str
    limit: int
    model: str
    variant: str
    fair_window: int
    weight: float | None
    ttl_s: int

    def entry(self, job: NewJob) -> bytes:
        """A held item: its record's fields (what a batch's end writes for an item never
        enqueued, `HELD_END`), then its stream entry."""
        entry = job.entry
        record: dict[str, str | int] = {
            "tenant": entry.tenant,
            "created": int(entry.enqueued_ms),
            "stream": self.stream,
        }
        head = {"id": entry.job_id, "fields": _strings(job.fields), "record": _strings(record)}
        encoded = {k: as_text(v) if isinstance(v, bytes) else v for k, v in entry.encode().items()}
        return dumps(head) + b"\n" + dumps(encoded)

    def job(self, raw: bytes) -> NewJob:
        """The job a held item (`entry`) is: may_exist, so a feeder that follows one that died
        after enqueueing it finds its hash and enqueues nothing twice."""
        head, _, body = raw.partition(b"\n")
        flat = loads(head)["fields"]
        fields = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
        encoded = {k.encode(): str(v).encode() for k, v in loads(body).items()}
        entry = RequestEntry.decode(encoded)
        window, weight = self.fair_window, self.weight
        return NewJob(entry, self.stream, fields, window, weight, self.ttl_s, may_exist=True)


def _strings(fields: Mapping[str, str | int]) -> list[str]:
    return [str(part) for pair in fields.items() for part in pair]


def held_lanes(fields: Mapping[str, str]) -> list[HeldLane]:
    """A batch's held lists, one per partition that had items its lane had no room for."""
    return [HeldLane(**lane) for lane in loads(fields.get("held_lists") or "[]")]


def held_lists_field(lanes: Sequence[HeldLane]) -> dict[str, str]:
    """The batch hash's `held_lists` (none held: no field)."""
    return {"held_lists": dumps([asdict(lane) for lane in lanes]).decode()} if lanes else {}


def _counts(fields: Mapping[str, str], seen: Sequence[int | bytes]) -> dict[str, int]:
    return {
        state: int(fields.get(f"n_{state}", 0)) + int(extra)
        for state, extra in zip(ITEM_STATES, seen, strict=True)
    }


def final_counts(fields: Mapping[str, str]) -> dict[str, int]:
    """The counts of a batch that is not running: those counted for good."""
    return _counts(fields, [0] * len(ITEM_STATES))


def _recounted(fields: Mapping[str, str], late: Counter[str]) -> dict[str, int]:
    """The counts with the `late` results moved to `expired`, written whole rather than added
    to, so a finalizer that takes over a silent one writes the same."""
    if not late:
        return {}
    moved = {f"n_{state}": int(fields.get(f"n_{state}", 0)) - n for state, n in late.items()}
    return {**moved, "n_expired": int(fields.get("n_expired", 0)) + late.total()}


@dataclass(slots=True)
class Refresh:
    """One look at a batch: its hash, the counts of finished items (those counted for good plus
    those seen finished past the cursors), and whether this caller is to finalize it."""

    fields: dict[str, str]
    finalize: bool
    counts: dict[str, int]


@dataclass(slots=True)
class ItemState:
    job_id: str
    status: str | None
    custom_id: str | None
    line: int
    outputs: bytes | None
    error: bytes | None
    finished: int | None = None  # when its job ended (ms): FINISH writes the worker's stamp
    deadline: int | None = None  # its job's: the batch's expiry, or its line's own, earlier

    def late(self, until: int | None) -> bool:
        """A result that came after `until` (`window_end`)."""
        return (
            until is not None
            and self.status in _RESULTS
            and self.finished is not None
            and self.finished > until
        )

    def expired_by_window(self, until: int | None) -> bool:
        """Expired by a worker that read it past `until` (`window_end`) with the batch's expiry
        as its deadline: the window stopped it, as the sweeper would have had it come first."""
        return (
            until is not None
            and self.status == JobStatus.EXPIRED
            and self.deadline is not None
            and self.deadline >= until
        )

    def stopped_by_batch(self) -> bool:
        """Ended by its batch's cancel or expiry (`ended_early`), or gone with the batch's keys:
        not an item cancelled alone, or expired by its line's own deadline."""
        if self.status is None:
            return True
        if self.status not in _STOPPED or self.error is None:
            return False
        error = loads(self.error)
        return isinstance(error, dict) and error.get("by") == BY_BATCH

    def reported(self, until: int | None) -> ItemState:
        """The item as its batch reports it: a late result is not the batch's, but `expired`,
        as if the expiry had stopped the job, which it did stop for an item a worker expired
        past the window (`expired_by_window`)."""
        if not (self.late(until) or self.expired_by_window(until)):
            return self
        error = ended_early(BatchStatus.EXPIRED)
        return replace(self, status=JobStatus.EXPIRED.value, outputs=None, error=error)


class BatchApiStore(TenantIndexed):
    """A tenant lists its batches (TenantIndexed, by `batches_of`)."""

    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._count = client.register_script(batch_api_scripts.COUNT)
        self._advance = client.register_script(batch_api_scripts.ADVANCE)
        self._request_end = client.register_script(batch_api_scripts.REQUEST_END)
        self._commit = client.register_script(batch_api_scripts.COMMIT)
        self._set_unless_set = client.register_script(batch_api_scripts.SET_UNLESS_SET)
        self._replace_list = client.register_script(batch_api_scripts.REPLACE_LIST)
        self._fed = client.register_script(batch_api_scripts.FED)
        self._held_end = client.register_script(batch_api_scripts.HELD_END)

    def index_of(self, tenant: str) -> str:
        return self.keys.batches_of(tenant)

    def unlisted_of(self, tenant: str) -> str:
        return self.keys.batches_unlisted_of(tenant)

    @property
    def listed_for_s(self) -> int:
        """As long as its hash may live: its window and a TTL from its create (a create refuses
        a window longer than a TTL), then a TTL from its `finish`, which the sweeper, back after
        every producer was down, may do as late as that: 3 TTLs from its create."""
        return 3 * self.ttl_s

    async def create(self, batch_id: str, fields: Mapping[str, str | int], ttl_s: int) -> int:
        """Store a batch `validating`; returns its `created_at` (ms), which it is listed by
        (`enlist`) once its create ends."""
        key = self.keys.batch(batch_id)
        created_at = now_ms()
        mapping = {**fields, "status": BatchStatus.VALIDATING.value, "created_at": created_at}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, items=_flat(mapping))
            pipe.expire(key, ttl_s)
            await pipe.execute()
        return created_at

    async def add_items(
        self,
        batch_id: str,
        items: Sequence[tuple[str, str | None]],
        rejected: Sequence[bytes],
        ttl_s: int,
        held: Sequence[tuple[str, Sequence[bytes]]] = (),
    ) -> None:
        """Record the items `(job_id, open list)` in line order (open list None: held, in
        `held`'s lists, `(held list, HeldLane.entry of each)`, in line order) and the refused
        lines, in one round trip (no transaction: the lists are in several slots, and the batch
        is not read before `start`). Each list is written whole with its TTL at once
        (`REPLACE_LIST`), so none outlives the batch's hash unless `finish` renews it, and
        afresh, so a rerun (the client retries a pipeline whose reply was lost) does not list
        an item twice."""
        by_list: dict[str, list[str]] = {}
        for job_id, open_list in items:
            if open_list is not None:
                by_list.setdefault(open_list, []).append(job_id)
        lists: list[tuple[str, Sequence[str | bytes]]] = [
            (self.keys.batch_items(batch_id), [job_id for job_id, _ in items]),
            *by_list.items(),
            *held,
            (self.keys.batch_rejected(batch_id), rejected),
        ]

        def queue(pipe: Any) -> None:
            for key, values in lists:
                queue_script(pipe, self._replace_list, [key], [ttl_s, *values])

        await self._confirmed(queue, [key for key, _ in lists], [self._replace_list])

    async def start(
        self,
        batch_id: str,
        lists: list[str],
        items: int,
        fields: Mapping[str, str | int],
        expires_ms: int,
        files_kept_s: int | None = None,
    ) -> None:
        """validating → in_progress with `items` open in `lists`, held ones included (or
        straight to failed when no line was valid, indexed all the same: the sweeper then hands
        over a webhook its create could not, and releases it). A failed batch ends here as a
        finalizer's `finish` ends one (`COMMIT`): its error file, its refused lines, kept
        `files_kept_s` (its create's `OUTPUT_EXPIRES_AFTER`) from now, the result TTL at most,
        as that file's object says, not its window and a TTL from its create.

        The hash and the active index are in different slots, so this is two steps, the hash
        first: a crash between leaves a running batch outside the index whose id nobody was
        given (the create answered no 202), so nothing ever looks at it and its keys expire
        with their TTL. The other order could leave the index naming a batch that never runs."""
        status = BatchStatus.IN_PROGRESS if lists else BatchStatus.FAILED
        started = now_ms()
        mapping = {
            "status": status.value,
            f"{status.value}_at": started,
            **fields,
            "open_lists": dumps(lists).decode(),
            "open": items,
        }
        key, active = self.keys.batch(batch_id), self.keys.batches_active
        if lists:
            await self._confirmed(lambda pipe: pipe.hset(key, items=_flat(mapping)), [key])
        else:
            names = self._ended_keys(batch_id)
            args = [self.ttl_s, self._files_until(started, files_kept_s), *_flat(mapping)]
            queue = partial(queue_script, script=self._commit, keys=names, args=args)
            await self._confirmed(queue, names, [self._commit])
        await self._confirmed(lambda pipe: pipe.zadd(active, {batch_id: expires_ms}), [active])

    async def _confirmed(
        self,
        queue: Callable[[Any], object],
        written: Sequence[str],
        scripts: Sequence[AsyncScript] = (),
    ) -> None:
        """Run the writes `queue` puts on a pipeline, with `CONVEYOR_REPLICA_ACKS` followed by a
        WAIT on the master of each key `written` (ReplicaAckTimeout when too few replicas
        confirm): a create's 202 rests on them. On the same connection, as WAIT counts only its
        own connection's writes; it confirms that master's earlier writes too (the hash
        `create` wrote). The `scripts` it calls are loaded where a server lacks them."""

        async def fill(pipe: Any) -> int:
            queue(pipe)
            return await queue_replica_wait(self.redis, pipe, written)

        waits, replies = await run_pipeline(self.redis, fill, scripts)
        check_replica_acks(replies[len(replies) - waits :])

    async def read(self, batch_id: str) -> dict[str, str] | None:
        """None for a batch gone, and for a hash with no `status`: what a write into a batch
        hash that had expired left (before `SET_UNLESS_SET`), never a batch, which a look then
        failed on (a 500)."""
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        return fields if "status" in fields else None

    async def refresh(self, batch_id: str, window: int, stale_ms: int = STALE_MS) -> Refresh | None:
        """Count what finished in every partition, then apply it to the batch hash; None when
        the batch does not exist. A batch not running costs one HGETALL."""
        fields = await self.read(batch_id)
        if fields is None:
            return None
        status = fields["status"]
        if status not in {BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING}:
            return Refresh(fields, False, final_counts(fields))
        counted: Sequence[list[int]] = []
        if status == BatchStatus.IN_PROGRESS and int(fields.get("open", 0)) > 0:
            counted = await asyncio.gather(
                *(
                    self._count_from(index, key, int(fields.get(f"at:{index}", 0)), window)
                    for index, key in enumerate(open_lists(fields))
                )
            )
        args: list[EncodableT] = [now_ms(), stale_ms, uuid.uuid4().hex[:16], *chain(*counted)]
        reply = await self._advance(keys=[self.keys.batch(batch_id)], args=args)
        if not reply:
            return None
        finalize, flat, *seen = reply
        fields = _fields(flat)
        return Refresh(fields, bool(finalize), _counts(fields, seen))

    async def _count_from(self, index: int, key: str, at: int, window: int) -> list[int]:
        """COUNT one partition from its cursor `at`, again while the budget cuts it short;
        returns ADVANCE's arguments for it: index, from, to, counts..., seen...."""
        start, states = at, len(ITEM_STATES)
        counts = [0] * states
        while True:
            at, more, *rest = await self._count(
                keys=[key], args=[self.keys.job_prefix, at, BUDGET, window]
            )
            counts = [total + int(n) for total, n in zip(counts, rest[:states], strict=True)]
            if not more:
                return [index, start, int(at), *counts, *(int(n) for n in rest[states:])]

    async def request_end(
        self, batch_id: str, ending: BatchStatus
    ) -> tuple[str | None, BatchStatus | None]:
        """Ask a running batch to end as `ending`. Returns (status, ending in force): the
        ending is None when the batch is not running, and the first one asked when two race."""
        status, in_force = await self._request_end(
            keys=[self.keys.batch(batch_id)], args=[ending.value, now_ms()]
        )
        return (
            as_text(status) if status else None,
            BatchStatus(as_text(in_force)) if in_force else None,
        )

    async def open_ids(self, fields: Mapping[str, str]) -> list[str]:
        """Every job id past its partition's cursor (what a cancel or an expiry must settle)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for index, key in enumerate(open_lists(fields)):
                pipe.lrange(key, int(fields.get(f"at:{index}", 0)), -1)
            lists = await pipe.execute()
        return [as_text(job_id) for ids in lists for job_id in ids]

    async def end_held(self, fields: Mapping[str, str], ending: BatchStatus) -> None:
        """End a batch's held items as `ending` (`HELD_END`), CHUNK a call: they join their
        partitions' item lists, where the caller settles and counts them as any open item."""
        args: list[EncodableT] = [self.keys.job_prefix, CHUNK]
        error = ended_early(ending).decode()
        end = {"status": ending.value, "error": error, "finished": now_ms()}
        for lane in held_lanes(fields):
            keys = [lane.held, lane.items]
            while await self._held_end(keys=keys, args=[*args, lane.ttl_s, *_flat(end)]):
                pass

    async def lane_lengths(self, streams: Sequence[str]) -> list[int]:
        """How many entries each bulk lane holds (XLEN), in one round trip: what a create and
        the feeding of held items size the room they take by (ENQUEUE still enforces it)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xlen(stream)
            return [int(length) for length in await pipe.execute()]

    async def held_waiting(self, lanes: Sequence[HeldLane]) -> list[int]:
        """How many items each held list still has, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for lane in lanes:
                pipe.llen(lane.held)
            return [int(n) for n in await pipe.execute()]

    async def held_head(self, lane: HeldLane, count: int) -> list[bytes]:
        """The first `count` held items, in line order."""
        rows = await self.redis.lrange(lane.held, 0, count - 1)
        return [raw.encode() if isinstance(raw, str) else raw for raw in rows]

    async def fed(self, lane: HeldLane, head: bytes, job_ids: Sequence[str]) -> bool:
        """The held items from `head` on that the lane took leave the held list for the item
        list (`FED`); False when another feeder recorded them first."""
        return bool(await self._fed(keys=[lane.held, lane.items], args=[head, *job_ids]))

    async def items(
        self, batch_id: str, until: int | None = None
    ) -> AsyncIterator[list[ItemState]]:
        """Items in line order, a chunk per round trip (one LRANGE plus pipelined HMGETs); with
        `until` (`window_end`), as the batch reports them (`ItemState.reported`)."""
        key = self.keys.batch_items(batch_id)
        for start in range(0, await self.redis.llen(key), CHUNK):
            ids = [as_text(i) for i in await self.redis.lrange(key, start, start + CHUNK - 1)]
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(self.keys.job(job_id), *_ITEM_FIELDS)
                rows = await pipe.execute()
            yield [
                _item(job_id, row).reported(until) for job_id, row in zip(ids, rows, strict=True)
            ]

    async def rejected(self, batch_id: str) -> AsyncIterator[list[dict[str, object]]]:
        """Lines refused at submit, in line order, a chunk per round trip."""
        key = self.keys.batch_rejected(batch_id)
        for start in range(0, await self.redis.llen(key), CHUNK):
            yield [loads(line) for line in await self.redis.lrange(key, start, start + CHUNK - 1)]

    async def finish(self, batch_id: str, status: BatchStatus) -> BatchStatus:
        """finalizing → `status`; returns the status committed. The batch's hash now lives
        `ttl_s` from here, and the keys its output and error files are read from (its item and
        refused lists, its item job hashes, so early items' output does not expire before the
        rest) as long as those files: `file_expiry` from its end, which its
        `OUTPUT_EXPIRES_AFTER` may make sooner, so they go when the file objects say. The
        batch's slot changes at once (`COMMIT`), the commit point (a
        finalizer that dies before it is replaced after STALE_MS). The keys in other slots are
        the caller's to `release` after it, once the batch's webhook is handed over: an ended
        batch still in the active index is one whose finalizer died after the commit, which the
        sweeper completes.
        An expired batch's results that came after its window (`ItemState.late`) are counted as
        expired here, as its files report them; a batch heading to `completed` that has one
        (workers check an item's deadline as they read it, not as they write its result), or an
        item the window stopped (`ItemState.expired_by_window`), ends `expired` instead, whoever
        counts it and whenever. An early end that stopped no item (`ItemState.stopped_by_batch`),
        every one having ended before it was asked, ends the batch `completed`, as a look a
        moment before it would have. Its counts are final once it is
        finalizing, and moved once: a finalizer that took over a silent one may find that one's
        commit made, which it keeps; one the other commits while it reads the items is kept too,
        and returned (`COMMIT`), its items given that end's expiry (`_expire_as_committed`). A
        batch whose hash expired meanwhile stays gone (`COMMIT`)."""
        fields = await self.read(batch_id) or {}
        committed = "status" in fields and BatchStatus(fields["status"]).terminal
        if committed:  # kept
            status, until = BatchStatus(fields["status"]), None
        else:
            until = _checked_until(status, fields)
        ended = now_ms()  # the files' `created_at`, so their keys expire when they say
        asked = fields.get(OUTPUT_EXPIRES_AFTER)
        kept_s = int(asked) if asked else None
        files_until = self._files_until(ended, kept_s)
        late: Counter[str] = Counter()
        stopped = False  # an item the window stopped
        cut_short = False  # an item its early end stopped
        async for chunk in self.items(batch_id):
            await self._expire_items(chunk, files_until)
            late.update(str(item.status) for item in chunk if item.late(until))
            stopped = stopped or any(item.expired_by_window(until) for item in chunk)
            cut_short = cut_short or any(item.stopped_by_batch() for item in chunk)
        if status in ENDED_EARLY and not (committed or cut_short):
            status = BatchStatus.COMPLETED  # every item had ended before its end was asked
        if late or stopped:
            status = BatchStatus.EXPIRED
        ending = {
            "status": status.value,
            f"{status.value}_at": ended,
            **_recounted(fields, late),
        }
        names = self._ended_keys(batch_id)
        kept = await self._commit(keys=names, args=[self.ttl_s, files_until, *_flat(ending)])
        if not kept:
            return status
        if isinstance(kept, list):  # another's end, at another time (`COMMIT`)
            kept, at = kept
            await self._expire_as_committed(batch_id, int(at), kept_s)
        return BatchStatus(as_text(kept))

    async def _expire_as_committed(self, batch_id: str, at: int, kept_s: int | None) -> None:
        """Give the items the expiry of the end in force, ended `at` (ms), which is not this
        finalizer's: another's, committed while this one was silent past STALE_MS (or before it
        began). Left at its own, earlier end's, the items expired before the files that read
        them, their last stretch "record expired" lines."""
        files_until = self._files_until(at, kept_s)
        async for chunk in self.items(batch_id):
            await self._expire_items(chunk, files_until)

    async def _expire_items(self, chunk: Sequence[ItemState], files_until: int) -> None:
        """The chunk's item job hashes expire with the files (Unix s), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for item in chunk:
                pipe.expireat(self.keys.job(item.job_id), files_until)
            await pipe.execute()

    def _ended_keys(self, batch_id: str) -> list[str]:
        """`COMMIT`'s keys: the batch's hash, then the lists its files are read from."""
        return [
            self.keys.batch(batch_id),
            self.keys.batch_items(batch_id),
            self.keys.batch_rejected(batch_id),
        ]

    def _files_until(self, ended_ms: int, kept_s: int | None) -> int:
        """When the output and error files of a batch ended at `ended_ms` expire (Unix s):
        `kept_s` (its create's `OUTPUT_EXPIRES_AFTER`) later, the result TTL at most."""
        return file_expiry(ended_ms // 1000, kept_s, self.ttl_s)

    async def release(self, batch_id: str, fields: Mapping[str, str]) -> None:
        """Drop an ended batch's per-partition lists and move it from the active index to the
        ended one (kept ENDED_KEPT_MS, the index too: trimmed only as a batch ends, it outlived
        the last one for ever), in one round trip. Idempotent: the sweeper repeats it
        for a finalizer that died after the commit."""
        now = now_ms()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in open_lists(fields):
                pipe.delete(key)
            for lane in held_lanes(fields):
                pipe.delete(lane.held)
            pipe.zrem(self.keys.batches_active, batch_id)
            pipe.zadd(self.keys.batches_ended, {batch_id: now})
            pipe.zremrangebyscore(self.keys.batches_ended, "-inf", now - ENDED_KEPT_MS)
            pipe.pexpire(self.keys.batches_ended, ENDED_KEPT_MS)
            await pipe.execute()

    async def forget(self, batch_id: str) -> None:
        """Drop a batch whose keys expired before it ended from the active index; it does not
        join the ended one, having nothing left to show."""
        await self.redis.zrem(self.keys.batches_active, batch_id)

    async def ended_since(self, since_ms: int) -> list[str]:
        """Batches that ended at `since_ms` or later (at most ENDED_KEPT_MS ago), oldest first."""
        rows: list[Any] = await self.redis.zrangebyscore(self.keys.batches_ended, since_ms, "+inf")
        return [as_text(batch_id) for batch_id in rows]

    async def active(self) -> list[tuple[str, int]]:
        """Running batches with their expiry (ms)."""
        rows: list[Any] = await self.redis.zrange(self.keys.batches_active, 0, -1, withscores=True)
        return [(as_text(batch_id), int(score)) for batch_id, score in rows]

    async def set_fields(self, batch_id: str, fields: Mapping[str, str | int]) -> None:
        await self.redis.hset(self.keys.batch(batch_id), items=_flat(fields))

    async def set_field_unless_set(self, batch_id: str, name: str, value: str) -> None:
        """Only into a batch still there (`SET_UNLESS_SET`)."""
        await self._set_unless_set(keys=[self.keys.batch(batch_id)], args=[name, value])


_ITEM_FIELDS = ("status", "custom_id", "line", "outputs", "error", "finished", "deadline")


def _item(job_id: str, row: list[bytes | None]) -> ItemState:
    status, custom_id, line, outputs, error, finished, deadline = row
    return ItemState(
        job_id=job_id,
        status=as_text(status) if status is not None else None,
        custom_id=as_text(custom_id) if custom_id is not None else None,
        line=int(line) if line is not None else 0,
        outputs=outputs,
        error=error,
        finished=int(finished) if finished is not None else None,
        deadline=int(deadline) if deadline is not None else None,
    )
