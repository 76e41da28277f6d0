"""Dead-letter replays on a real Valkey, no stack: a letter is replayed as one job, however many
replays read it at once (two operators in the console, the CLI beside it)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.dead_letters import (
    DEADLINE_PASSED,
    DEADLINE_UNMEETABLE,
    PAGE,
    QUEUE_FULL,
    DeadLetter,
    DeadLetters,
    KeptLetter,
)
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys, new_job_id, replay_job_id
from shared.model_repository import ModelConfig, QueueLimits
from tests.test_queue_eta_deadlines import IDLE, PER_S, _measured, _queue_eta
from workers.partition.partition import Partition
from workers.partition.stream_reader import Delivery

KEYS = Keys("dl:")
MODEL, VARIANT = "m", "default"


async def _dead_letter(
    client: aioredis.Redis,
    tenant: str,
    lane: str | None = None,
    deadline_ms: int = 0,
    batch: str = "",
    partition: tuple[Keys, str] = (KEYS, MODEL),
) -> str:
    """A dead letter as the reclaimer writes it (its entry's fields, the lane it died in,
    reason and deliveries); `lane` None: one written before letters named their lane.
    `partition`: the keys and model it died in."""
    keys, model = partition
    payload = {"inputs": {"t": tenant}}
    entry = RequestEntry(
        new_job_id(model, VARIANT), payload, now_ms(), deadline_ms, tenant, batch=batch
    )
    named = {} if lane is None else {"lane": lane}
    fields = {"entry": "1-0", **named, "reason": "crashed", "deliveries": 3, **entry.encode()}
    await client.xadd(keys.dlq(model, VARIANT), fields)  # type: ignore[arg-type]
    return entry.job_id


async def _every_letter(letters: DeadLetters) -> list[DeadLetter]:
    return [letter async for page in letters.pages() for letter in page]


def _replayer(client: aioredis.Redis, both_read: asyncio.Barrier) -> DeadLetters:
    """A partition's dead letters, whose replay goes on only once `both_read` is passed: two
    replays at once both read every letter before either removes one."""
    letters = DeadLetters(JobStore(client, KEYS, 60), KEYS, MODEL, VARIANT)
    read = letters.entries

    async def read_then_wait(count: int = 1000, after: str = "") -> list[DeadLetter]:
        found = await read(count, after)
        await both_read.wait()
        return found

    letters.entries = read_then_wait  # type: ignore[method-assign]
    return letters


async def test_two_replays_at_once_enqueue_each_letter_once(aredis: aioredis.Redis) -> None:
    dead = [await _dead_letter(aredis, tenant) for tenant in ("a", "b", "c")]
    both_read = asyncio.Barrier(2)
    replays = await asyncio.gather(*(_replayer(aredis, both_read).replay() for _ in "12"))
    first, second = (replay.replayed for replay in replays)
    queued = [RequestEntry.decode(f) for _, f in await aredis.xrange(KEYS.queue(MODEL, VARIANT))]
    assert len(queued) == 3  # not six
    assert first == second and [old for old, _ in first] == dead
    assert [e.job_id for e in queued] == [new for _, new in first]
    assert [(e.tenant, e.payload) for e in queued] == [(t, {"inputs": {"t": t}}) for t in "abc"]
    for old, new in first:
        job = await aredis.hgetall(KEYS.job(new))
        assert job[b"replay_of"].decode() == old and job[b"status"] == b"queued"
    assert await aredis.xlen(KEYS.dlq(MODEL, VARIANT)) == 0
    again = await DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT).replay()
    assert (again.replayed, again.kept) == ([], [])


async def test_every_letter_past_the_first_page_is_listed_and_replayed(
    aredis: aioredis.Redis,
) -> None:
    """After an outage a partition may hold thousands of letters: listing and replaying all of
    them stopped at the first 1,000 (the rest stayed dead, silently), and so did replaying a
    letter by its id when it lay past them."""
    dead = [await _dead_letter(aredis, "t") for _ in range(PAGE * 2 + 100)]
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    every = await _every_letter(letters)
    assert [letter.job_id for letter in every] == dead
    assert await letters.depth() == len(dead)

    late = every[PAGE + 500]
    one = await letters.replay([late.dlq_id, "0-1", "not-an-id"])  # unknown ids are skipped
    assert one.replayed == [(late.job_id, replay_job_id(MODEL, VARIANT, late.job_id, late.dlq_id))]
    rest = await letters.replay()
    assert [old for old, _ in rest.replayed] == [job_id for job_id in dead if job_id != late.job_id]
    assert await aredis.xlen(KEYS.dlq(MODEL, VARIANT)) == 0
    assert await aredis.xlen(KEYS.queue(MODEL, VARIANT)) == len(dead)


async def test_a_malformed_id_replays_and_purges_nothing(aredis: aioredis.Redis) -> None:
    """A purge naming a malformed id sent Redis an XDEL it refused whole (a 500 from the console,
    a traceback from the CLI); a bare `<ms>` replayed every letter of that millisecond."""
    await _dead_letter(aredis, "a")
    await _dead_letter(aredis, "b")
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    (first, *_) = await letters.entries()
    assert await letters.purge(["bogus", "1-x"]) == 0
    assert (await letters.replay([first.dlq_id.partition("-")[0]])).replayed == []
    assert await letters.depth() == 2
    assert await letters.purge(["bogus", first.dlq_id]) == 1
    assert await letters.depth() == 1


async def test_a_letter_named_twice_is_replayed_and_counted_once(aredis: aioredis.Redis) -> None:
    """`conveyor dlq replay --id X --id X` (or `X` beside `0X`, the same id) enqueued one job
    but answered `X -> R` twice and `replayed 2`: the operator was told of a replay that never
    happened. Each letter is acted on once, however often its id is given."""
    job_id = await _dead_letter(aredis, "a")
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    ((dlq_id, _),) = await aredis.xrange(KEYS.dlq(MODEL, VARIANT))
    named = dlq_id.decode()
    assert [letter.dlq_id for letter in await letters.letters_of([named, named])] == [named]
    result = await letters.replay([named, named, f"0{named}"])
    assert result.replayed == [(job_id, replay_job_id(MODEL, VARIANT, job_id, named))]
    assert await aredis.xlen(KEYS.queue(MODEL, VARIANT)) == 1


async def test_a_replayed_letter_keeps_its_webhook_on_record(aredis: aioredis.Redis) -> None:
    """A replay's webhook was in its payload only: cancelling the replay, or its dead letter,
    was never reported."""
    url = "https://hooks.example.com/jobs"
    entry = RequestEntry(new_job_id(MODEL, VARIANT), {"inputs": {}, "webhook": url}, now_ms())
    fields = {"entry": "1-0", "reason": "crashed", "deliveries": 3, **entry.encode()}
    await aredis.xadd(KEYS.dlq(MODEL, VARIANT), fields)  # type: ignore[arg-type]
    store = JobStore(aredis, KEYS, 60)
    ((_, replay),) = (await DeadLetters(store, KEYS, MODEL, VARIANT).replay()).replayed
    record = await store.get(replay)
    assert record is not None and record.fields["webhook"] == url


async def test_a_replay_names_the_job_it_runs_again_in_its_view_and_its_events(
    aredis: aioredis.Redis,
) -> None:
    """A replay is a new job id: its view (GET /v1/jobs/{id}) and its webhook events (the
    worker's view) never said which job it ran again, so a receiver got events for an id it
    never submitted."""
    old = await _dead_letter(aredis, "t")
    store = JobStore(aredis, KEYS, 60)
    ((_, new),) = (await DeadLetters(store, KEYS, MODEL, VARIANT).replay()).replayed
    record = await store.get(new)
    assert record is not None and record.view()["replay_of"] == old
    entry = await _replayed(aredis, KEYS.queue(MODEL, VARIANT))
    config = ModelConfig(name=MODEL, kind="batch", backend="identity")
    delivery = Delivery(b"1-0", entry, JobStatus.QUEUED, now_ms())
    finish = Partition.of(KEYS, config, VARIANT).finish(delivery, JobStatus.SUCCEEDED, {})
    assert finish.view()["replay_of"] == old  # what its webhook event carries


async def test_a_letter_is_replayed_on_its_own_lane_and_queued_fairly_there(
    aredis: aioredis.Redis,
) -> None:
    """Every replay went to the online lane, past fair queuing: replaying a batch's thousands
    of letters put them ahead of every interactive job, and ahead of the tenants a fair lane
    held back. A letter from the bulk lane is replayed there; in a fair lane whose stream holds
    its window, the replay is held for its tenant's turn."""
    online, bulk = KEYS.queue(MODEL, VARIANT), KEYS.bulk_queue(MODEL, VARIANT)
    await aredis.xgroup_create(bulk, "workers", "0", mkstream=True)
    await _dead_letter(aredis, "batch", bulk)
    await _dead_letter(aredis, "old")  # a letter that does not say: the online lane
    await aredis.xadd(bulk, {"id": "waiting"})  # the bulk lane's window of 1, undelivered
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT, fair_window=1)
    (_, held), (_, plain) = (await letters.replay()).replayed
    assert await aredis.hget(KEYS.job(held), "held") == b"1"  # its tenant's turn will come
    assert await aredis.lrange(KEYS.held(bulk, "batch"), 0, -1) != []
    assert [RequestEntry.decode(f).job_id for _, f in await aredis.xrange(online)] == [plain]


async def test_purging_every_letter_removes_every_letter(aredis: aioredis.Redis) -> None:
    """An approximate XTRIM (redis-py's default) removes whole nodes only, at most 10,000
    entries a call: "Discard all" of an outage's 25,000 letters left 15,000 behind, and said
    it had removed 10,000. Bounded by the newest letter shown, the same holds."""
    stream = KEYS.dlq(MODEL, VARIANT)
    entry = RequestEntry(new_job_id(MODEL, VARIANT), {"inputs": {}}, now_ms()).encode()
    fields = {"entry": "1-0", "reason": "crashed", "deliveries": 3, **entry}
    pipe = aredis.pipeline(transaction=False)
    for _ in range(25_000):
        pipe.xadd(stream, fields)  # type: ignore[arg-type]
    ids = await pipe.execute()
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    assert await letters.counted() == (25_000, ids[-1].decode())
    assert await letters.purge(upto=ids[19_999].decode()) == 20_000
    assert await letters.depth() == 5_000
    assert await letters.purge() == 5_000
    assert await letters.counted() == (0, "")


async def _replayed(client: aioredis.Redis, stream: str) -> RequestEntry:
    """The one entry a replay queued in `stream`."""
    ((_, fields),) = await client.xrange(stream)
    return RequestEntry.decode(fields)


async def test_a_batch_items_replay_is_bounded_by_its_batch_not_the_queue_time(
    aredis: aioredis.Redis,
) -> None:
    """A replay kept only the job id, payload and tenant: a Batch API item's replay lost its
    batch, so the bulk lane's max_queue_time_s expired every one a worker had not read in
    time (after an outage, most of a "replay all" of thousands), though a batch's items wait
    as long as its window; its record too, which kept the result TTL alone (60 s here), so it
    could expire while the job waited in its window."""
    window = now_ms() + 3_600_000
    await _dead_letter(aredis, "t", KEYS.bulk_queue(MODEL, VARIANT), window, batch="b1")
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    ((_, new),) = (await letters.replay()).replayed
    entry = await _replayed(aredis, KEYS.bulk_queue(MODEL, VARIANT))
    assert (entry.job_id, entry.batch, entry.deadline_ms) == (new, "b1", window)
    assert 3_600 < await aredis.ttl(KEYS.job(new)) <= 3_660  # the window's hour, then 60 s
    config = ModelConfig(
        name=MODEL, kind="batch", backend="identity", queue=QueueLimits(max_queue_time_s=1)
    )
    read_late = Delivery(b"1-0", entry, JobStatus.QUEUED, int(entry.enqueued_ms) + 2_000)
    assert Partition.of(KEYS, config, VARIANT).skip_or_expire(read_late) is None


async def test_a_replay_keeps_its_jobs_deadline(aredis: aioredis.Redis) -> None:
    """A replay dropped the job's deadline: it ran after the client's cutoff, and the job's
    record did not show one."""
    deadline = now_ms() + 60_000
    await _dead_letter(aredis, "t", deadline_ms=deadline)
    store = JobStore(aredis, KEYS, 60)
    ((_, new),) = (await DeadLetters(store, KEYS, MODEL, VARIANT).replay()).replayed
    assert (await _replayed(aredis, KEYS.queue(MODEL, VARIANT))).deadline_ms == deadline
    record = await store.get(new)
    assert record is not None and record.fields["deadline"] == str(deadline)


async def test_a_letter_past_its_deadline_is_kept_not_replayed(aredis: aioredis.Redis) -> None:
    """A replay past the job's deadline could only expire (or run for a client that stopped
    waiting): the letter stays, for an operator to discard, and the others are replayed. The
    replay says which it kept and why (only the server's log did: the operator who replayed
    saw fewer jobs than letters, and no reason), whether it named the letter or replayed all."""
    past = await _dead_letter(aredis, "late", deadline_ms=now_ms() - 1)
    live = await _dead_letter(aredis, "live")
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT)
    (late, _) = await letters.entries()
    kept = [KeptLetter(late.dlq_id, past, DEADLINE_PASSED)]
    named = await letters.replay([late.dlq_id])
    assert (named.replayed, named.kept) == ([], kept)
    replay = await letters.replay()
    assert [old for old, _ in replay.replayed] == [live] and replay.kept == kept
    assert [letter.job_id for letter in await _every_letter(letters)] == [past]
    assert await aredis.xlen(KEYS.queue(MODEL, VARIANT)) == 1
    assert not await aredis.exists(KEYS.job(replay_job_id(MODEL, VARIANT, past, late.dlq_id)))


async def test_a_replay_stops_at_its_lanes_max_length_and_keeps_the_rest(
    aredis: aioredis.Redis,
) -> None:
    """A replay ignored `queue.max_length`: replaying an outage's 10,000 letters into a lane
    capped at 1,000 filled it ten times over while the API refused submits with 429. The replay
    fills the lane to its cap and keeps the rest, named, for a replay once it drains; a full
    lane does not stop the other lane's letters."""
    online, bulk = KEYS.queue(MODEL, VARIANT), KEYS.bulk_queue(MODEL, VARIANT)
    dead = [await _dead_letter(aredis, tenant, online) for tenant in "abc"]
    batch = await _dead_letter(aredis, "batch", bulk)
    letters = DeadLetters(JobStore(aredis, KEYS, 60), KEYS, MODEL, VARIANT, max_length=2)
    result = await letters.replay()
    assert [old for old, _ in result.replayed] == [*dead[:2], batch]
    (left,) = await letters.entries()
    assert result.kept == [KeptLetter(left.dlq_id, dead[2], QUEUE_FULL)]
    assert (await aredis.xlen(online), await aredis.xlen(bulk)) == (2, 1)


async def test_a_letter_its_lane_cannot_start_by_its_deadline_is_kept(
    aredis: aioredis.Redis,
) -> None:
    """A replay skipped the deadline admission of a model that admits by deadline: a letter whose
    deadline the lane's backlog put out of reach (the submit of its job would be refused 429
    `deadline_unmeetable`) was enqueued only to expire. It is kept, named with that reason, by
    the producers' own admission, and one the lane can still start in time is replayed."""
    keys, backlog = Keys(), 100  # 100 entries ahead in a worker-free lane drained at PER_S a s
    await _measured(aredis, IDLE, backlog)
    eta = _queue_eta(aredis)
    await eta.refresh()
    config = eta.repository.models["idle"]
    lane, in_10_s = (keys, "idle"), now_ms() + backlog // PER_S * 1000
    near = await _dead_letter(aredis, "near", IDLE, in_10_s - 5_000, partition=lane)
    far = await _dead_letter(aredis, "far", IDLE, in_10_s + 60_000, partition=lane)
    store, admission = JobStore(aredis, keys, 60), eta.admission(config, VARIANT)
    letters = DeadLetters(store, keys, "idle", VARIANT, admission=admission)
    (first, _) = await letters.entries()
    result = await letters.replay()
    assert [old for old, _ in result.replayed] == [far]
    assert result.kept == [KeptLetter(first.dlq_id, near, DEADLINE_UNMEETABLE)]
    assert [letter.job_id for letter in await _every_letter(letters)] == [near]
    assert await aredis.xlen(IDLE) == backlog + 1
