"""The dead-letter stream of a partition (`cv:dlq:{tag}:{model}:{variant}`): list what died and why,
replay it as new jobs once the cause is fixed, or purge it. Dead-lettered jobs stay `failed`
(terminal states never change); a replay is a new job that records `replay_of`, on the lane its
letter died in (a Batch API item's replay goes to the bulk lane, where interactive jobs go
first), through fair queuing where the lane has it (a letter does not record its key's weight:
the replay's tenant keeps the weight recorded for it, else gets the default). A replay keeps its
job's deadline and batch, so it waits as its job would have (a batch item: its batch's window,
not `max_queue_time_s`); a letter whose deadline has passed is not replayed (it could only
expire) and stays until purged: the replay's result names it (`ReplayResult.kept`, with the
reason), so whoever replayed sees what was kept and why. A replay is admitted as a submit is,
by the lane's `queue.max_length`: once its lane is full the letters left for it stay
(`QUEUE_FULL`), to be replayed again when the lane has drained (a replay past the cap filled
the lane that the API was refusing submits to with 429s); and, for a model that admits by
deadline (`queue.admit_by_deadline`), by the producers' deadline admission: a letter that would
start after its deadline given the lane's ETA stays (`DEADLINE_UNMEETABLE`), as its submit
would be refused, rather than be enqueued only to expire. So does one that today's submit checks
refuse (`submit_checks`): the model's input schema, its parameter limits (`max_tokens_limit`),
or the webhook URL policy may have changed since its job was submitted (`INPUT_INVALID`,
`PARAMETERS_INVALID`, `WEBHOOK_REFUSED`, with what the check said).

The stream has no cap and no TTL (a cap would drop letters unseen): only a purge or replay
shrinks it; the producer's `conveyor_dlq_depth` gauge and `conveyor dlq list` show it, and
`conveyor dlq show` one letter whole."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import job_scripts
from shared.codec import RequestEntry, as_text, is_stream_id, stream_id
from shared.job_parameters import ParametersRefused, check_parameters
from shared.job_store import JobStore, NewJob, QueueFull, TooFarBack, stamp_ms
from shared.keys import Keys, replay_job_id
from shared.model_repository import ModelConfig
from shared.partition_stats import read_dlq_depths
from shared.problem_list import listed
from shared.redis_client import RedisClient, executed
from shared.settings import Settings
from shared.webhook_events import refusal as webhook_refusal

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DeadLetter:
    dlq_id: str
    job_id: str
    reason: str
    deliveries: int
    entry: RequestEntry
    lane: str = ""  # the stream it died in ('' in letters written before it was recorded)
    # An entry no worker could read as a job (RECLAIM dead-letters it as it is): its fields
    # as text, for `show`; None for a job's letter. Never replayed (`UNDECODABLE`).
    undecodable: dict[str, str] | None = None

    def view(self) -> dict[str, Any]:
        """The letter whole, as an operator inspects it before a replay (what the job asked,
        whose it was, where it died), not only the reason `list` gives; an undecodable one's
        fields as they are."""
        letter = {
            "dlq_id": self.dlq_id,
            "job_id": self.job_id,
            "reason": self.reason,
            "deliveries": self.deliveries,
            "died_ms": stream_id(self.dlq_id)[0],  # its DLQ id is stamped as it died
            "lane": self.lane,
        }
        if self.undecodable is not None:
            return letter | {"fields": self.undecodable}
        entry = self.entry
        return letter | {
            "tenant": entry.tenant,
            "enqueued_ms": entry.enqueued_ms,
            "deadline_ms": entry.deadline_ms,
            "batch": entry.batch,
            "payload": entry.payload,
        }


PAGE = 1_000  # letters per XRANGE
DEADLINE_PASSED = "deadline_passed"  # a kept letter's reason: its replay could only expire
QUEUE_FULL = "queue_full"  # a kept letter's reason: its lane held queue.max_length jobs
# a kept letter's reason: more wait ahead in its lane than can start before its deadline (or
# max_queue_time_s), the reason a submit gets its 429 for
DEADLINE_UNMEETABLE = "deadline_unmeetable"
# a kept letter's reason: its entry is no job (no id, a payload that is no JSON object), so
# there is nothing to replay; it stays for an operator to `show` and purge
UNDECODABLE = "undecodable"
# a kept letter's reason: its job's inputs break the model's input schema as it is now
INPUT_INVALID = "input_invalid"
# a kept letter's reason: its job's parameters are ones the model refuses now (a generate
# model's `max_tokens_limit` lowered; any for a batch model)
PARAMETERS_INVALID = "parameters_invalid"
# a kept letter's reason: its job's webhook URL is one the webhook policy now refuses
WEBHOOK_REFUSED = "webhook_refused"

# The most entries that may wait ahead of a job for it to start in time, by (its lane is the
# bulk one, its enqueue stamp in ms, its deadline in Unix ms or 0), -1 for any, None where it
# would start too late however few wait (a stalled partition: ENQUEUE's bound, 0 ahead, admits
# it on an empty lane): the producers' deadline admission (producer_api's
# `QueueEta.admission`), which shared code cannot import.
Admission = Callable[[bool, float, int], int | None]


def admit_any(bulk: bool, enqueued_ms: float, deadline_ms: int) -> int:
    """No deadline admission (a caller that gives none): any number may wait ahead."""
    return -1


# Why today's submit checks refuse a letter's job, given its variant, as (a kept reason, what the
# check said), or None where they admit it (`submit_checks`).
Refusal = Callable[[str, RequestEntry], tuple[str, str] | None]


def refuse_none(variant: str, entry: RequestEntry) -> tuple[str, str] | None:
    """No submit checks (a caller that gives none): every letter's job is admitted."""
    return None


def submit_checks(config: ModelConfig, webhooks: Settings | None) -> Refusal:
    """The producers' submit checks of a job, run on a letter's job before its replay: its
    inputs against the model's input schema, its parameters against the variant's limits and,
    given the webhook settings (`webhooks`), its webhook URL against that policy, all as they
    are now. A replay they refuse could only fail on the worker, or send its events where the
    policy no longer allows."""

    def refusal(variant: str, entry: RequestEntry) -> tuple[str, str] | None:
        if problems := config.input_errors(entry.payload.get("inputs")):
            return INPUT_INVALID, listed(problems)
        parameters = entry.payload.get("parameters") or {}
        if not isinstance(parameters, dict):  # a letter written by hand: a submit takes none such
            return PARAMETERS_INVALID, "parameters: not a JSON object"
        try:
            check_parameters(config, variant, parameters)
        except ParametersRefused as refused:
            return PARAMETERS_INVALID, refused.message
        webhook = entry.payload.get("webhook")
        # a submit takes a URL string only; handed to Redis, another type failed the whole replay
        if webhook is not None and not isinstance(webhook, str):
            return WEBHOOK_REFUSED, "webhook: not a string"
        if webhook and webhooks and (why := webhook_refusal(webhook, webhooks)):
            return WEBHOOK_REFUSED, why
        return None

    return refusal


@dataclass(frozen=True, slots=True)
class KeptLetter:
    """A letter a replay left in the stream, and why (`DEADLINE_PASSED`, `QUEUE_FULL`,
    `DEADLINE_UNMEETABLE`, `UNDECODABLE`, `INPUT_INVALID`, `PARAMETERS_INVALID`,
    `WEBHOOK_REFUSED`); `detail`: what the submit check that refused it said."""

    dlq_id: str
    job_id: str
    reason: str
    detail: str = ""


@dataclass(slots=True)
class ReplayResult:
    """What a replay did: each replayed letter's (old job id, new job id), and the letters it
    kept, so the operator who asked for the replay learns of them (not only the server's log)."""

    replayed: list[tuple[str, str]] = field(default_factory=list)
    kept: list[KeptLetter] = field(default_factory=list)


class DeadLetters:
    def __init__(
        self,
        store: JobStore,
        keys: Keys,
        model: str,
        variant: str,
        fair_window: int = 0,
        max_length: int = 0,
        admission: Admission = admit_any,
        refusal: Refusal = refuse_none,
    ) -> None:
        """`fair_window`: the partition's (ModelConfig.fair_window_of; 0: not fair);
        `max_length`: its `queue.max_length`, which replays are admitted by (0: no cap);
        `admission`: its deadline admission, which replays are admitted by too; `refusal`: its
        submit checks (`submit_checks`), which each letter's job must pass to be replayed."""
        self.store = store
        self.redis = store.redis
        self.keys = keys
        self.model = model
        self.variant = variant
        self.stream = keys.dlq(model, variant)
        self.fair_window = fair_window
        self.max_length = max_length
        self.admission = admission
        self.refusal = refusal
        self._replay_letter = self.redis.register_script(job_scripts.REPLAY_LETTER)

    async def partition_exists(self) -> bool:
        """Whether the partition was ever used here: its queue (a worker creates it) or its
        dead-letter stream exists. A mistyped model or variant has neither."""
        found: int = await self.redis.exists(self.stream, self.keys.queue(self.model, self.variant))
        return found > 0

    async def entries(self, count: int = PAGE, after: str = "") -> list[DeadLetter]:
        """Up to `count` letters, oldest first, after the letter `after` (from the first)."""
        start = f"({after}" if after else "-"
        rows: Any = await self.redis.xrange(self.stream, min=start, count=count)
        return [_dead_letter(dlq_id, fields) for dlq_id, fields in rows]

    async def pages(self, upto: str = "") -> AsyncIterator[list[DeadLetter]]:
        """Every letter, a page at a time; with `upto`, only those up to that letter (the
        newest an operator confirmed: what died after it is not touched)."""
        page = await self.entries()
        while page:
            if upto:
                page = [letter for letter in page if stream_id(letter.dlq_id) <= stream_id(upto)]
            if not page:
                return
            yield page
            page = await self.entries(PAGE, page[-1].dlq_id)

    async def counted(self) -> tuple[int, str]:
        """How many letters the stream holds and the newest's id ('' when there is none): the
        count and bound of a confirmed "all", read at once (one MULTI), so the count is of
        exactly the letters up to the bound (in two round trips, a letter that died between
        them was acted on uncounted)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xlen(self.stream)
            pipe.xrevrange(self.stream, count=1)
            letters, rows = await pipe.execute()
        return int(letters), rows[0][0].decode() if rows else ""

    async def shown(self, letter: DeadLetter) -> dict[str, Any]:
        """The letter whole (`view`) with its job's `attempt_history` while the job's record is
        kept (`result_ttl_s` after it failed): each attempt's worker, start, end and how it
        ended. The letter says only how many deliveries it had, not who ran them or when."""
        shown = letter.view()
        record = await self.store.get(letter.job_id) if letter.job_id else None
        if record is not None:
            shown["attempt_history"] = record.view(history=True)["attempt_history"]
        return shown

    async def unreadable(self) -> str | None:
        """Why the letters cannot be read where their key holds another type than a stream
        (written by hand, or a prefix another application shares): Redis refuses every read of
        it with WRONGTYPE, which the CLI answered with a traceback and the console with a 500.
        None for a stream, or no key."""
        kind = as_text(await self.redis.type(self.stream))
        if kind in ("stream", "none"):
            return None
        return (
            f"{self.stream} is a {kind}, not a stream of dead letters (check CONVEYOR_KEY_PREFIX,"
            " or what wrote that key)"
        )

    async def depth(self) -> int:
        letters: int = await self.redis.xlen(self.stream)
        return letters

    async def replay(self, ids: list[str] | None = None, upto: str = "") -> ReplayResult:
        """Enqueue each dead letter (those of `ids`, else every one, up to `upto` if given)
        again as a new job, then remove the letter. A letter is replayed as one job however
        many replays read it. A letter past its job's deadline, or that its lane refuses (full,
        or too many ahead to meet its deadline), is kept, not replayed (`_replay_page`), and
        named in the result."""
        result, full = ReplayResult(), set[str]()
        if ids is not None:
            await self._replay_page(await self.letters_of(ids), result, full)
        else:
            async for page in self.pages(upto):
                await self._replay_page(page, result, full)
        if result.kept:
            message = (
                "%s:%s: %d dead letters not replayed"
                " (deadline passed or unmeetable, lane full, undecodable, or refused by"
                " today's submit checks): %s"
            )
            kept = listed([letter.dlq_id for letter in result.kept], " ")
            log.warning(message, self.model, self.variant, len(result.kept), kept)
        return result

    async def _replay_page(
        self, letters: list[DeadLetter], result: ReplayResult, full: set[str]
    ) -> None:
        """Replay the letters whose job's deadline is still ahead (or that have none) into
        `result`; the others are kept: their replay would only expire, for a client that
        stopped waiting. They stay for an operator to purge. So are those whose lane (`full`:
        the lanes found full so far) refused one: once full, a lane is not tried again for the
        rest of this replay, which would cost a round trip per letter for refusals. A letter
        too far back to start before its deadline is kept too (a later one, whose deadline is
        further off, may still be admitted), and so is one that today's submit checks refuse
        (checked before its lane: a replay once the lane drains would be refused again)."""
        now = stamp_ms()
        for letter in letters:
            lane = self._lane(letter)
            if letter.undecodable is not None:
                result.kept.append(KeptLetter(letter.dlq_id, letter.job_id, UNDECODABLE))
            elif 0 < letter.entry.deadline_ms <= now:
                result.kept.append(KeptLetter(letter.dlq_id, letter.job_id, DEADLINE_PASSED))
            elif refused := self.refusal(self.variant, letter.entry):
                result.kept.append(KeptLetter(letter.dlq_id, letter.job_id, *refused))
            elif lane in full:
                result.kept.append(KeptLetter(letter.dlq_id, letter.job_id, QUEUE_FULL))
            else:
                try:
                    if replayed := await self._replay(letter, lane):
                        result.replayed.append(replayed)
                except QueueFull:
                    full.add(lane)
                    result.kept.append(KeptLetter(letter.dlq_id, letter.job_id, QUEUE_FULL))
                except TooFarBack:
                    kept = KeptLetter(letter.dlq_id, letter.job_id, DEADLINE_UNMEETABLE)
                    result.kept.append(kept)

    def _lane(self, letter: DeadLetter) -> str:
        """The lane a letter's replay goes to: the one its job died in (the online lane for a
        letter that does not say)."""
        bulk = self.keys.bulk_queue(self.model, self.variant)
        return bulk if letter.lane == bulk else self.keys.queue(self.model, self.variant)

    async def letters_of(self, ids: list[str]) -> list[DeadLetter]:
        """The letters of `ids` that exist, in one round trip, each once however often it is
        named (`X` twice, or `X` and `0X`: replayed once, it was reported replayed twice); an
        unknown or malformed id is skipped, as a purge of it removes nothing; a bare `<ms>`
        would name every letter of that millisecond."""
        pipe = self.redis.pipeline(transaction=False)
        for dlq_id in filter(is_stream_id, ids):
            pipe.xrange(self.stream, min=dlq_id, max=dlq_id)
        found = await executed(pipe, raise_on_error=False)
        rows = {row[0]: row[1] for rows in found if isinstance(rows, list) for row in rows}
        return [_dead_letter(dlq_id, fields) for dlq_id, fields in rows.items()]

    async def absent(self, ids: list[str]) -> list[str]:
        """Those of `ids` that name no letter (malformed, or none such: replayed or purged
        already, or never one), for a CLI to say so rather than act on nothing silently."""
        found = {stream_id(letter.dlq_id) for letter in await self.letters_of(ids)}
        return [
            dlq_id for dlq_id in ids if not is_stream_id(dlq_id) or stream_id(dlq_id) not in found
        ]

    async def _replay(self, letter: DeadLetter, stream: str) -> tuple[str, str] | None:
        """Enqueue the letter's job again and remove the letter, in one step (REPLAY_LETTER),
        admitted as its submit was: by the lane's length, and by deadline (`admission`) unless it
        is a batch item, which its batch's window bounds, not `max_queue_time_s`, and no submit
        refuses by deadline. None where the letter was purged since it was read: it is not
        replayed (one replayed by another replay meanwhile is reported, its one job's ids)."""
        entry = RequestEntry(
            job_id=replay_job_id(self.model, self.variant, letter.job_id, letter.dlq_id),
            payload=letter.entry.payload,
            enqueued_ms=stamp_ms(),
            deadline_ms=letter.entry.deadline_ms,
            tenant=letter.entry.tenant,
            batch=letter.entry.batch,  # a batch item's window bounds its wait, as its job's
            replay_of=letter.job_id,
        )
        fields: dict[str, str | int] = {
            "model": self.model,
            "variant": self.variant,
            "replay_of": letter.job_id,
        }
        if webhook := letter.entry.payload.get("webhook"):
            fields["webhook"] = webhook  # where a cancel or a dead letter finds it, as any job's
        bulk = stream == self.keys.bulk_queue(self.model, self.variant)
        max_ahead = (
            -1 if entry.batch else self.admission(bulk, entry.enqueued_ms, entry.deadline_ms)
        )
        if max_ahead is None:  # late with none ahead, which ENQUEUE would admit
            raise TooFarBack(stream, 0)
        fair = (self.fair_window, None)
        # a batch item's record lives out its window, then the result TTL, as its first did
        ttl_s = self.store.ttl_until(entry.deadline_ms) if entry.batch else 0
        job = NewJob(entry, stream, fields, *fair, ttl_s=ttl_s, may_exist=True)
        letter_call = ([self.stream], [letter.dlq_id])  # REPLAY_LETTER's own, after ENQUEUE's
        admitted, _ = await self.store.enqueue_through(
            self._replay_letter, job, self.max_length, max_ahead, letter_call
        )
        return (letter.job_id, entry.job_id) if admitted == 1 else None

    async def purge(self, ids: list[str] | None = None, upto: str = "") -> int:
        """Remove the letters of `ids` (a malformed id removes nothing; Redis refused the
        whole XDEL for it, a 500), else every letter, up to `upto` if given. Trimmed exactly:
        an approximate XTRIM (redis-py's default) removes whole nodes only, at most 10,000
        entries a call, and kept the rest while saying how many it removed."""
        if ids is not None:
            valid = [dlq_id for dlq_id in ids if is_stream_id(dlq_id)]
            removed: int = await self.redis.xdel(self.stream, *valid) if valid else 0
            return removed
        # one command, so a letter that dies meanwhile is either counted and removed, or kept
        after = _next_id(upto) if upto else None
        trimmed: int
        if after is None:  # every letter
            trimmed = await self.redis.xtrim(self.stream, maxlen=0, approximate=False)
        else:
            trimmed = await self.redis.xtrim(self.stream, minid=after, approximate=False)
        return trimmed


async def lettered_partitions(redis: RedisClient, keys: Keys) -> list[tuple[str, str]]:
    """Every partition (model, variant) that has dead-lettered a job, from the index the
    reclaimer adds to (`enlist_lettered`), not from the model repository: a model or variant
    taken out of it keeps its letters, which only `conveyor dlq MODEL --variant V` reached."""
    return (await read_lettered(redis, keys))[0]


async def read_lettered(
    redis: RedisClient, keys: Keys
) -> tuple[list[tuple[str, str]], list[bytes | str]]:
    """The index's partitions (`lettered_partitions`) and its members that name none (written
    by hand: no `model:variant`, or no UTF-8, whose decode failed every read of the index), for
    the gauge refresh to remove (`delist_lettered`): skipped when read, they were kept for ever."""
    partitions, malformed = [], []
    for member in await redis.smembers(keys.lettered):
        if partition := _partition(member):
            partitions.append(partition)
        else:
            malformed.append(member)
    return sorted(partitions), malformed


async def enlist_lettered(redis: RedisClient, keys: Keys, model: str, variant: str) -> None:
    """Note that the partition holds dead letters (the reclaimer, once RECLAIM dead-lettered
    some: rare, so a round trip of its own; the index is in the control slot, RECLAIM in the
    partition's). After the letters' XADD, never before: `delist_lettered` relies on it."""
    await redis.sadd(keys.lettered, _member(model, variant))


async def delist_lettered(
    redis: RedisClient,
    keys: Keys,
    partitions: Sequence[tuple[str, str]],
    malformed: Sequence[bytes | str] = (),
) -> list[tuple[str, str]]:
    """Take partitions out of the index (one SREM, with the `malformed` members; none sent for
    none): those the repository no longer serves and that held no letter when the producer's
    gauge refresh read them, which were listed, their `conveyor_dlq_depth` reading 0, for ever.
    A letter may have died in one since that read, its SADD undone by the SREM: each one's
    letters are counted again after it and one that holds some is listed again. Its writer
    XADDs before it SADDs, so a letter this count misses SADDs after the SREM. (The index and
    the streams are in different slots: no script may read one and write the other.) Returns
    the partitions left out of the index."""
    members: list[bytes | str] = [*(_member(*partition) for partition in partitions), *malformed]
    if not members:
        return []
    await redis.srem(keys.lettered, *members)
    refilled = [
        (model, variant)
        for model, variant, depth in await read_dlq_depths(redis, keys, partitions)
        if depth
    ]
    if refilled:
        await redis.sadd(keys.lettered, *(_member(*partition) for partition in refilled))
    return [partition for partition in partitions if partition not in refilled]


def _member(model: str, variant: str) -> str:
    """A partition's member of the index."""
    return f"{model}:{variant}"


def _partition(member: bytes | str) -> tuple[str, str] | None:
    """The partition (model, variant) a member of the index names; None for one naming none."""
    try:
        model, _, variant = as_text(member).partition(":")
    except UnicodeDecodeError:
        return None
    return (model, variant) if model and variant else None


def _next_id(entry_id: str) -> str | None:
    """The id right after `entry_id`, None after the greatest (no letter can follow it; its
    successor, one past 64 bits, made Redis refuse the XTRIM: a 500)."""
    ms, seq = stream_id(entry_id)
    after = f"{ms}-{seq + 1}" if seq < 2**64 - 1 else f"{ms + 1}-0"
    return after if is_stream_id(after) else None


def _count(text: str) -> int:
    """A letter's delivery count; 0 for one that is no count (a letter written by hand: its
    ValueError made the console's dead-letter page a 500)."""
    return int(text) if text.isascii() and text.isdigit() else 0


def _dead_letter(dlq_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    """A letter as read; one whose entry is no job is `undecodable`, not raised: RECLAIM
    dead-letters an entry its workers could not read as it is, and a KeyError on it ended
    `list`, `show` and `replay` with a traceback, every other letter of the partition out of
    reach with it."""

    def field(name: str, default: str = "") -> str:
        return fields.get(name.encode(), default.encode()).decode(errors="replace")

    undecodable: dict[str, str] | None = None
    try:
        entry = RequestEntry.decode(fields)
        if not isinstance(entry.payload, dict):
            raise ValueError("the payload is no JSON object")
    except (KeyError, ValueError):
        entry = RequestEntry(field("id"), {}, 0.0, tenant=field("tenant"))
        undecodable = {
            key.decode(errors="replace"): value.decode(errors="replace")
            for key, value in fields.items()
        }
    return DeadLetter(
        dlq_id=dlq_id.decode(),
        job_id=entry.job_id,
        reason=field("reason"),
        deliveries=_count(field("deliveries", "0")),
        entry=entry,
        lane=field("lane"),
        undecodable=undecodable,
    )
