"""A read that Redis served but whose reply an outage lost (a torn connection, a failover)
leaves its entries in the worker's pending list, where nobody runs them until reclaim, a
visibility timeout later. After an outage the worker's own read path (LaneScheduler,
StreamReader) runs them first, except those it still has in hand. On a real Valkey, no engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.redis_client import connect
from tests.lane_rig import abandoned_after, queue_jobs, until_blocked_in_read
from workers.partition.arrival_rate import ArrivalRate
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import Delivery, MicroBatch, StreamReader

KEYS = Keys("lost:")
CONFIG = ModelConfig(
    name="m", kind="batch", backend="identity", queue=QueueLimits(visibility_timeout_s=60)
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
WORKER = "box-5-55"


async def _queued(store: JobStore, aredis: aioredis.Redis, *job_ids: str) -> StreamReader:
    """Jobs queued in the partition's online lane, and a reader of its lanes."""
    for job_id in job_ids:
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    return reader


def _jobs(batches: list[MicroBatch]) -> list[str]:
    return [d.entry.job_id for _, deliveries in batches for d in deliveries if d.entry]


async def test_after_an_outage_the_entries_a_lost_read_was_handed_run_first(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    reader = await _queued(store, aredis, "a", "b", "c")
    events = JobEvents("redis://unused")
    lanes = LaneScheduler(PARTITION, reader, Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, events))
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)

    lost = await lanes.next_batch(10, 0, 100)  # Redis served it; its reply never arrived
    assert _jobs(lost) == ["a", "b", "c"]
    assert await lanes.next_batch(10, 0, 50) == []  # an ordinary read does not see them
    in_hand = {(lost[0][0], lost[0][1][0].entry_id)}  # "a" still runs (a staged micro-batch)

    lanes.outage()
    recovered: list[Delivery] = []
    while batches := await lanes.next_batch(1, 0, 50, in_hand):
        ((stream, deliveries),) = batches
        recovered += deliveries
        await writer.finish(
            stream, [PARTITION.finish(d, JobStatus.SUCCEEDED, {}) for d in deliveries]
        )

    assert [d.entry.job_id for d in recovered if d.entry] == ["b", "c"]
    for job_id in ("b", "c"):
        record = await store.get(job_id)
        assert record is not None and record.status == JobStatus.SUCCEEDED
    # "a", still in hand, is pending as it was: its reads of the pending list counted no
    # delivery of it (three used to, and a crash then dead-lettered it before its time)
    [running] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert running["message_id"] == lost[0][1][0].entry_id and running["times_delivered"] == 1
    # back to ordinary reads: a new job is handed over by the blocking read
    await store.create(
        RequestEntry("d", {"inputs": {}}, now_ms()), PARTITION.online, {"model": "m"}
    )
    assert _jobs(await lanes.next_batch(10, 0, 50, in_hand)) == ["d"]


async def _cut_read(aredis: aioredis.Redis, redis_url: str, max_items: int) -> list[MicroBatch]:
    """What a blocking `next_batch` of `max_items` returns when its stop cuts the read."""
    patient = connect(redis_url, blocks_ms=600_000)  # its socket outlasts the block
    reader = StreamReader(patient, KEYS, PARTITION.streams, WORKER)
    events = JobEvents("redis://unused")
    lanes = LaneScheduler(
        PARTITION, reader, Reclaimer(patient, KEYS, PARTITION, WORKER, 60, events)
    )
    stop = Stopping()
    reading = asyncio.create_task(lanes.next_batch(max_items, 0, 600_000, stop=stop))

    try:
        await until_blocked_in_read(aredis)
        stop.set()
        return await asyncio.wait_for(reading, 30)  # a bound: the block is 10 min
    finally:
        await patient.aclose()


async def test_a_stop_ends_the_blocking_read_and_claims_back_what_its_cut_reply_handed_over(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """An idle worker's stop waited out its read's block (CONVEYOR_BLOCK_MS), past a shorter
    shutdown grace; cut short now, the read's reply may have been lost on the way, so what this
    consumer was handed and does not hold is claimed back, to finish before it stops."""
    await _queued(JobStore(aredis, KEYS, ttl_s=60), aredis, "a")
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # the cut reply's entry
    assert _jobs(await _cut_read(aredis, redis_url, 10)) == ["a"]


async def test_a_cut_read_of_both_lanes_is_claimed_back_whole(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """A micro-batch loop's blocking read hands over up to `max_items` of each lane; claimed
    back after a cut as `max_items` in all, the rest stayed pending on a consumer that then
    exited, run by nobody until another worker's reclaim, a visibility timeout later."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await _queued(store, aredis, "a")
    await queue_jobs(store, PARTITION.bulk, "b")
    streams = {PARTITION.online: ">", PARTITION.bulk: ">"}
    await aredis.xreadgroup(GROUP, WORKER, streams, count=1)  # the cut reply's entries

    batches = await _cut_read(aredis, redis_url, 1)

    assert sorted(_jobs(batches)) == ["a", "b"]
    assert all(len(deliveries) <= 1 for _, deliveries in batches)  # micro-batches of max_items


async def test_a_generate_loops_recovered_jobs_are_marked_running(aredis: aioredis.Redis) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("g", {"inputs": {}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # served; reply lost

    ((_, (delivery,)),) = await reader.held(PARTITION.streams, 10, frozenset())

    assert delivery.entry is not None and delivery.entry.job_id == "g"
    assert delivery.status == JobStatus.RUNNING
    assert not delivery.redelivered and delivery.attempts == 1  # its first delivery, all along
    record = await store.get("g")
    assert record is not None and record.status == JobStatus.RUNNING


async def test_an_entry_reclaimed_by_a_reclaim_whose_reply_was_lost_is_a_redelivery(
    aredis: aioredis.Redis,
) -> None:
    """RECLAIM took over a dead consumer's entry but its reply was lost: claimed back from the
    pending list, it was handed over as a first delivery, and a generation run again this way
    wrote no `restart`, so readers showed the dead run's text twice."""
    reader = await _queued(JobStore(aredis, KEYS, ttl_s=60), aredis, "again")
    [(_, [(entry_id, _)])] = await aredis.xreadgroup(GROUP, "dead", {PARTITION.online: ">"})
    await aredis.xclaim(PARTITION.online, GROUP, WORKER, 0, [entry_id])  # the lost RECLAIM

    ((_, (delivery,)),) = await reader.held(PARTITION.streams, 10, frozenset())

    assert delivery.entry_id == entry_id and delivery.redelivered and delivery.attempts == 2


async def test_an_entry_another_worker_reclaims_meanwhile_is_not_taken_back(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between listing its pending entries and claiming them back, another worker may reclaim
    one (idle past the visibility timeout, after a long outage): claimed back regardless, it
    would run on both workers."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    entry = RequestEntry("r", {"inputs": {}}, now_ms())
    await store.create(entry, PARTITION.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})  # served; reply lost
    await asyncio.sleep(0.05)
    listing = aredis.pipeline

    def reclaimed_after_listing(*args: Any, **kwargs: Any) -> Any:
        """The first pipeline (the listing) runs, then another worker reclaims the entry."""
        pipe = listing(*args, **kwargs)
        listed = pipe.execute

        async def execute(*a: Any, **k: Any) -> Any:
            rows = await listed(*a, **k)
            monkeypatch.setattr(aredis, "pipeline", listing)
            await aredis.xautoclaim(PARTITION.online, GROUP, "rescuer-7", 10, "0")
            return rows

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(aredis, "pipeline", reclaimed_after_listing)
    assert await reader.held(PARTITION.streams, 10, frozenset()) == []
    [row] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert row["consumer"] == b"rescuer-7"


async def test_a_touch_keeps_what_is_still_ours_and_gives_up_what_another_took(
    aredis: aioredis.Redis,
) -> None:
    """A long run's entries are re-claimed now and then, so no reclaimer takes them for
    abandoned; after an outage past the visibility timeout another worker may have taken one
    over. A plain XCLAIM took it back, and both ran the job (a generation's tokens interleaved)."""
    reader = await _queued(JobStore(aredis, KEYS, ttl_s=60), aredis, "kept", "taken", "done")
    [(_, rows)] = await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})
    kept, taken, done = (entry_id for entry_id, _ in rows)
    await aredis.xclaim(PARTITION.online, GROUP, "rescuer-7", 0, [taken], justid=True)
    await aredis.xack(PARTITION.online, GROUP, done)  # the rescuer ran it to the end
    await asyncio.sleep(0.3)
    idle_before = (await _pending(aredis))[kept]["time_since_delivered"]

    lost = await reader.touch(PARTITION.online, [kept, taken, done])

    assert lost == [taken.decode(), done.decode()]
    pending = await _pending(aredis)
    assert pending[taken]["consumer"] == b"rescuer-7" and done not in pending
    assert pending[kept]["consumer"] == WORKER.encode() and pending[kept]["times_delivered"] == 1
    assert pending[kept]["time_since_delivered"] < idle_before  # reset by the touch


async def _pending(aredis: aioredis.Redis) -> dict[bytes, dict[str, Any]]:
    rows = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    return {row["message_id"]: row for row in rows}


async def _slotted_lanes(aredis: aioredis.Redis, partition: Partition) -> LaneScheduler:
    """A generate loop's read path (jobs marked running as read) on `partition`."""
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER, mark_on_read=True)
    await reader.ensure_groups()
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    return LaneScheduler(partition, reader, reclaimer)


async def test_a_generate_loop_is_handed_no_more_jobs_than_it_has_free_slots(
    aredis: aioredis.Redis,
) -> None:
    """A read of both lanes took up to the free slots from each, and a reclaim a micro-batch's
    worth: a loop with 2 free slots started 4 generations, marked running where no idle worker
    could take them. Every job is still handed over, at most the free slots at a time."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    for index, stream in enumerate([PARTITION.online] * 3 + [PARTITION.bulk] * 3):
        entry = RequestEntry(f"s{index}", {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "default"})
    lanes = await _slotted_lanes(aredis, PARTITION)
    seen: list[str] = []
    while batches := await lanes.next_batch(2, 0, 50, slots=True):
        assert len(_jobs(batches)) <= 2, batches
        seen += _jobs(batches)
    assert seen == [f"s{index}" for index in range(6)]  # online first


async def test_a_generate_loop_reclaims_one_entry_at_a_time(aredis: aioredis.Redis) -> None:
    """A crashed worker's generations were reclaimed all together, up to the free slots: one
    prompt that kills the engine ran beside them again, killed them again, and took them all
    past `max_deliveries`. Now one at a time, the next once the last is no longer running, as a
    micro-batch loop's; new work fills the other slots in between."""
    partition = abandoned_after(KEYS, 1)
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, partition.online, *(f"r{index}" for index in range(5)))
    lanes = await _slotted_lanes(aredis, partition)
    await aredis.xreadgroup(GROUP, "dead-1", {partition.online: ">"})  # then it died
    await asyncio.sleep(1.1)  # past the visibility timeout
    await queue_jobs(store, partition.online, "n0")

    first = await lanes.next_batch(4, 0, 50, slots=True)
    assert _jobs(first) == ["r0"]
    running = {(partition.online, first[0][1][0].entry_id)}
    assert _jobs(await lanes.next_batch(3, 0, 50, running, slots=True)) == ["n0"]  # new work
    assert await lanes.next_batch(3, 0, 50, running, slots=True) == []  # r0 still runs
    assert _jobs(await lanes.next_batch(4, 0, 50, slots=True)) == ["r1"]


async def test_housekeeping_goes_on_while_a_reclaimed_generation_runs(
    aredis: aioredis.Redis,
) -> None:
    """Claiming waits for the reclaimed entry in hand to end, a reclaimed generation for
    minutes; the reclaim pass's housekeeping did too: an event left owed (its broker refused it)
    waited for the generation instead of half a visibility timeout. Here the owed job's hash is
    gone, so the pass settles it."""
    partition = abandoned_after(KEYS, 1)
    await queue_jobs(JobStore(aredis, KEYS, ttl_s=60), partition.online, "k0", "k1")
    lanes = await _slotted_lanes(aredis, partition)
    await aredis.xreadgroup(GROUP, "dead-2", {partition.online: ">"})  # then it died
    await asyncio.sleep(1.1)  # past the visibility timeout

    first = await lanes.next_batch(4, 0, 50, slots=True)
    assert _jobs(first) == ["k0"]
    running = {(partition.online, first[0][1][0].entry_id)}
    owed = KEYS.webhooks_owed(partition.online)
    await aredis.zadd(owed, {"gone-job": now_ms() - 2_000})
    await asyncio.sleep(0.6)  # past the pass's interval, half the visibility timeout
    for _ in range(2):  # a turn for new work, then the reclaim that waits for k0
        assert await lanes.next_batch(3, 0, 50, running, slots=True) == []
    assert await aredis.zcard(owed) == 0


async def test_after_an_outage_no_more_are_claimed_back_than_asked_for_in_all(
    aredis: aioredis.Redis,
) -> None:
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id, stream in (("h0", PARTITION.online), ("h1", PARTITION.bulk)):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "default"})
    lanes = await _slotted_lanes(aredis, PARTITION)
    await aredis.xreadgroup(GROUP, WORKER, dict.fromkeys(PARTITION.streams, ">"))  # reply lost
    lanes.outage()
    first = await lanes.next_batch(1, 0, 50, slots=True)
    assert _jobs(first) == ["h0"]
    running = {(stream, d.entry_id) for stream, deliveries in first for d in deliveries}
    assert _jobs(await lanes.next_batch(1, 0, 50, running, slots=True)) == ["h1"]


async def test_an_entry_of_the_other_lane_numbered_as_one_in_hand_is_claimed_back(
    aredis: aioredis.Redis,
) -> None:
    """The lanes' streams number entries alike (the same millisecond, sequence 0): known by
    its id alone, a bulk entry read with a running online entry of the same id counted as in
    hand, and waited a visibility timeout for reclaim."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id, stream in (("bulk-1", PARTITION.bulk), ("online-1", PARTITION.online)):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, stream, {"model": "m", "variant": "default"})
        # the online entry in a later millisecond: the bulk stream takes no id at or below its
        # last one, so in one millisecond the renumbering XADD below was refused
        await asyncio.sleep(0.002)
    [(online_id, _)] = await aredis.xrange(PARTITION.online)
    [(bulk_id, fields)] = await aredis.xrange(PARTITION.bulk)
    await aredis.xdel(PARTITION.bulk, bulk_id)
    await aredis.xadd(PARTITION.bulk, fields, id=online_id)  # numbered as the online entry
    lanes = await _slotted_lanes(aredis, PARTITION)
    await aredis.xreadgroup(GROUP, WORKER, dict.fromkeys(PARTITION.streams, ">"))  # reply lost
    lanes.outage()
    running = {(PARTITION.online, online_id)}
    assert _jobs(await lanes.next_batch(2, 0, 50, running, slots=True)) == ["bulk-1"]


async def test_a_consumer_handed_entries_while_it_is_pruned_keeps_them(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reclaimer saw a consumer idle with nothing pending, and deleted it a round trip later:
    a read that handed it entries in between lost them with it (DELCONSUMER drops a consumer's
    pending entries), in no pending list, never reclaimed. The delete now checks again."""
    config = ModelConfig(
        name="m", kind="batch", backend="identity", queue=QueueLimits(visibility_timeout_s=1)
    )
    partition = Partition.of(KEYS, config, "default")
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    await aredis.xreadgroup(GROUP, "other-1", {partition.online: ">"})  # joins, reads nothing
    await asyncio.sleep(1.1)  # idle past the visibility timeout
    entry = RequestEntry("raced", {"inputs": {}}, now_ms())
    await JobStore(aredis, KEYS, 60).create(entry, partition.online, {"model": "m"})
    listed = aredis.xinfo_consumers

    async def read_meanwhile(*args: Any, **kwargs: Any) -> Any:
        consumers = await listed(*args, **kwargs)
        await aredis.xreadgroup(GROUP, "other-1", {partition.online: ">"})  # handed "raced"
        return consumers

    monkeypatch.setattr(aredis, "xinfo_consumers", read_meanwhile)
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    assert await reclaimer.prune_consumers(partition.online) == []
    [pending] = await aredis.xpending_range(partition.online, GROUP, "-", "+", 10)
    assert pending["consumer"] == b"other-1"


async def test_a_dead_lettered_job_counts_as_a_failed_job(aredis: aioredis.Redis) -> None:
    """An entry past `max_deliveries` fails its job in RECLAIM: counted nowhere, a crashing
    variant's failures never reached `conveyor_jobs_finished_total`."""
    config = ModelConfig(
        name="m",
        kind="batch",
        backend="identity",
        queue=QueueLimits(visibility_timeout_s=0.2, max_deliveries=1),
    )
    partition = Partition.of(KEYS, config, "default")
    store = JobStore(aredis, KEYS, ttl_s=60)
    await store.create(RequestEntry("doomed", {"inputs": {}}, now_ms()), partition.online, {})
    await StreamReader(aredis, KEYS, partition.streams, WORKER).ensure_groups()
    await aredis.xreadgroup(GROUP, "dead-1", {partition.online: ">"})  # then it died
    await asyncio.sleep(0.3)  # past the visibility timeout
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    labels = {"model": "m", "variant": "default", "state": "failed"}
    before = REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0

    assert await reclaimer.reclaim(partition.online) == []  # dead-lettered, not run again

    record = await store.get("doomed")
    assert record is not None and record.status == JobStatus.FAILED
    assert REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) == before + 1


async def test_each_lane_keeps_its_own_arrival_rate(aredis: aioredis.Redis) -> None:
    """One estimate served both lanes: a Batch API drain's thousands of jobs a second made a
    lone online job wait `max_queue_delay_ms` for online arrivals that never came."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await queue_jobs(store, PARTITION.bulk, *(f"bulk{n}" for n in range(32)))
    await queue_jobs(store, PARTITION.online, "lone")
    lanes = await _slotted_lanes(aredis, PARTITION)
    assert len(await lanes.next_batch(32, 0, 50)) == 2  # one read of both lanes
    assert (
        lanes.arrivals[PARTITION.bulk].overall() > 10 * lanes.arrivals[PARTITION.online].overall()
    )
    assert not lanes.arrivals[PARTITION.online].expects_more(0.002)


async def test_a_top_up_blocks_no_longer_than_the_socket_timeout_allows(
    aredis: aioredis.Redis, redis_url: str, settings_env: Callable[..., None]
) -> None:
    """A micro-batch held open for more jobs blocked in one read for all of what was left of
    `max_queue_delay_ms` (up to a minute), past the socket timeout (`CONVEYOR_REDIS_TIMEOUT_S`
    beyond `CONVEYOR_BLOCK_MS`): the read failed as an outage, the micro-batch was dropped and
    claimed back a delivery more, and the next lone job after steady traffic did the same."""
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="0.2", CONVEYOR_BLOCK_MS="50")
    await _queued(JobStore(aredis, KEYS, ttl_s=60), aredis, "lone")
    client = connect(redis_url, name=WORKER)  # as a worker's: socket timeout 0.25 s
    try:
        reader = StreamReader(client, KEYS, PARTITION.streams, WORKER)
        [batch] = await reader.wait(PARTITION.streams, 8, 50)
        arrivals = ArrivalRate()
        arrivals.arrived(1_000)  # steady traffic until now: more jobs expected
        _, deliveries = await reader.gather(batch, 8, 1_000, arrivals=arrivals)
    finally:
        await client.aclose()
    assert [d.entry.job_id for d in deliveries if d.entry] == ["lone"]
    [pending] = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10)
    assert pending["times_delivered"] == 1


async def test_jobs_queued_in_both_lanes_after_the_take_fill_no_more_than_the_free_slots(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both lanes empty at the script's read, a generate loop blocks on both; jobs queued in
    each meanwhile were handed over up to the free slots from each lane: twice the slots, all
    marked running. The blocking read hands over no more than the free slots in all."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    lanes = await _slotted_lanes(aredis, PARTITION)
    take = lanes.reader.take

    async def queued_after_take(*args: Any) -> MicroBatch | None:
        found = await take(*args)
        await queue_jobs(store, PARTITION.online, "o0", "o1")
        await queue_jobs(store, PARTITION.bulk, "b0", "b1")
        return found

    monkeypatch.setattr(lanes.reader, "take", queued_after_take)
    handed = _jobs(await lanes.next_batch(2, 0, 50, slots=True))
    assert len(handed) in (1, 2), handed
    pending = [(await aredis.xpending(lane, GROUP))["pending"] for lane in PARTITION.streams]
    assert sum(pending) == len(handed)  # the rest still waits for any worker
