"""Fair queuing on a real Valkey, at the script level and through the worker's own read path
(LaneScheduler, StreamReader, ResultWriter; no engine): held jobs move into a fair lane's stream
by weighted deficit round robin, a short lane pays nothing, admission counts held jobs, a
cancelled held job never reaches a worker, and a held backlog drains under a worker that was
blocked on the empty stream when it arrived."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner

from conveyor.commands.keys import command as keys_command
from producer_api.console.job_browser import JobFilter, recent_jobs
from producer_api.task_cancel import cancel_and_wait
from shared.api_keys import InvalidKeySpec, KeySpec
from shared.codec import RequestEntry, as_text
from shared.dead_letters import DeadLetters
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, QueueFull, TooFarBack, now_ms
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, ModelRepository, QueueLimits
from shared.partition_stats import read_partition_stats
from shared.queue_position import QueuePositions
from shared.settings import get_settings
from tests.conftest import until_async
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import MicroBatch, StreamReader

KEYS = Keys("fq:")
CLI_KEYS = Keys()  # where the CLI stores keys (the default prefix)
WORKER = "fair-worker-1"
BLOCK_MS = 2_000


def _config(window: int, batch: int = 4) -> ModelConfig:
    queue = QueueLimits(fair=True, fair_window=window, visibility_timeout_s=30)
    return ModelConfig(
        name="m", kind="batch", backend="identity", max_batch_size=batch, queue=queue
    )


def _job(config: ModelConfig, tenant: str, weight: float = 1.0) -> NewJob:
    entry = RequestEntry(uuid.uuid4().hex, {"inputs": {"t": tenant}}, now_ms(), tenant=tenant)
    fields: dict[str, str | int] = {"model": "m", "variant": "default"}
    return NewJob(
        entry, KEYS.queue("m", "default"), fields, config.fair_window_of("default"), weight
    )


async def _enqueue(store: JobStore, jobs: list[NewJob], max_length: int = 0) -> list[int]:
    return await store.create_many(jobs, max_length)


async def _reader(client: aioredis.Redis, config: ModelConfig) -> StreamReader:
    partition = Partition.of(KEYS, config, "default")
    reader = StreamReader(client, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    return reader


async def _lane(client: aioredis.Redis, config: ModelConfig) -> tuple[JobStore, StreamReader, str]:
    """A job store, a worker's reader and the stream of `config`'s default lane."""
    return JobStore(client, KEYS, 60), await _reader(client, config), KEYS.queue("m", "default")


async def _take_tenants(reader: StreamReader, stream: str, count: int) -> list[str]:
    """Tenants of the jobs one TAKE hands over, in stream order."""
    taken = await reader.take([stream], count)
    return [d.entry.tenant for d in taken[1] if d.entry] if taken else []


async def test_held_tenants_drain_in_proportion_to_their_weights(aredis: aioredis.Redis) -> None:
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a", 1.0) for _ in range(24)])
    await _enqueue(store, [_job(config, "b", 3.0) for _ in range(24)])
    assert await aredis.xlen(stream) == 4  # the window; the rest is held
    assert await aredis.hget(KEYS.fair(stream), "held") == b"44"

    first = await _take_tenants(reader, stream, 4)
    assert first == ["a"] * 4  # what the stream held already, in arrival order
    served: list[str] = []
    for _ in range(6):
        served += await _take_tenants(reader, stream, 4)
    # each round of the ring: a (weight 1) one job, b (weight 3) three
    assert served.count("a") == 6 and served.count("b") == 18, served
    assert served[:8] == ["a", "b", "b", "b", "a", "b", "b", "b"]
    rest: list[str] = []
    while more := await _take_tenants(reader, stream, 4):
        rest += more
    assert rest == ["a", "b", "b", "b"] * 2 + ["a"] * 12  # b runs out: a alone, to the end
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"
    assert not await aredis.exists(KEYS.fair_ring(stream), KEYS.held(stream, "a"))


async def test_a_refill_numbers_what_it_moves_with_one_counter_read_and_write(
    aredis: aioredis.Redis,
) -> None:
    """The jobs a refill moves in are numbered on from the lane's counter (their queue
    positions count stream entries), which is read once and grown once, not INCRed per job."""
    config = _config(window=2)
    store, reader, stream = await _lane(aredis, config)
    jobs = [_job(config, "a") for _ in range(6)]
    await _enqueue(store, jobs)
    assert await aredis.xlen(stream) == 2  # the window; four held
    await aredis.config_resetstat()

    assert len(await _take_tenants(reader, stream, 6)) == 6  # the two, and the four moved in
    stats = await aredis.info("commandstats")
    assert "cmdstat_incr" not in stats and stats["cmdstat_incrby"]["calls"] == 1
    seqs = [await aredis.hget(KEYS.job(job.entry.job_id), "seq") for job in jobs]
    assert seqs == [str(n).encode() for n in range(1, 7)]
    assert await aredis.get(KEYS.added(stream)) == b"6"


async def test_a_newcomer_stands_behind_only_what_round_robin_serves_first(
    aredis: aioredis.Redis,
) -> None:
    """A held job's 202 position counts the held jobs deficit round robin moves before it, not
    every held job; deadline admission weighs that same position."""
    config = _config(window=4)
    store = JobStore(aredis, KEYS, 60)
    await _reader(aredis, config)
    stream = KEYS.queue("m", "default")
    await _enqueue(store, [_job(config, "a") for _ in range(24)])  # 4 in the stream, 20 held
    fair = (config.fair_window_of("default"), 1.0)
    flooder, newcomer = _job(config, "a"), _job(config, "b")
    assert await store.create(flooder.entry, stream, flooder.fields, fair=fair) == 4 + 20
    # b's first job: the stream's 4, then a's one job of the first round
    assert await store.create(newcomer.entry, stream, newcomer.fields, fair=fair) == 4 + 1
    positions = QueuePositions(aredis, KEYS)
    assert await positions.position(stream, None, "b") == 4 + 1  # what GET shows, held or not
    assert await positions.position(stream, None, "a") == 4 + 21  # a's last: behind b's turn
    late = _job(config, "c")
    with pytest.raises(TooFarBack) as refused:
        await store.create(late.entry, stream, late.fields, max_ahead=5, fair=fair)
    assert refused.value.ahead == 4 + 2  # a's and b's turns come first
    heavy = _job(config, "c", 3.0)
    assert await store.create(heavy.entry, stream, heavy.fields, max_ahead=6, fair=(4, 3.0)) == 6


async def test_a_short_fair_lane_appends_at_once(aredis: aioredis.Redis) -> None:
    config = _config(window=8)
    store = JobStore(aredis, KEYS, 60)
    await _reader(aredis, config)
    jobs = [_job(config, "a") for _ in range(3)]
    await _enqueue(store, jobs)
    stream = KEYS.queue("m", "default")
    assert await aredis.xlen(stream) == 3
    for index, job in enumerate(jobs, start=1):
        fields = await aredis.hgetall(KEYS.job(job.entry.job_id))
        assert b"held" not in fields and fields[b"seq"] == str(index).encode()
    assert not await aredis.exists(KEYS.fair(stream))


async def test_admission_counts_held_jobs(aredis: aioredis.Redis) -> None:
    config = _config(window=2)
    store = JobStore(aredis, KEYS, 60)
    await _reader(aredis, config)
    jobs = [_job(config, "a") for _ in range(7)]
    assert await _enqueue(store, jobs, max_length=5) == [5, 6]  # 2 in the stream, 3 held
    job = _job(config, "b")
    with pytest.raises(QueueFull) as full:
        await store.create(
            job.entry, job.stream, job.fields, 5, fair=(config.fair_window_of("default"), 1.0)
        )
    assert full.value.length == 5
    held = await aredis.hgetall(KEYS.job(jobs[2].entry.job_id))
    assert held[b"held"] == b"1" and b"seq" not in held  # its seq comes when it joins the stream
    [stats] = await read_partition_stats(aredis, KEYS, ModelRepository({"m": config}))
    assert (stats.online.length, stats.online.held) == (5, 3)  # what GET /v1/models shows


async def test_a_cancelled_held_job_never_reaches_a_worker(aredis: aioredis.Redis) -> None:
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    jobs = [_job(config, "a") for _ in range(3)]
    await _enqueue(store, jobs)
    doomed = jobs[1].entry.job_id
    await store.transition(doomed, JobStatus.CANCELLED)
    seen: list[str] = []
    while (taken := await reader.take([stream], 4)) is not None:
        seen += [d.entry.job_id for d in taken[1] if d.entry]
    assert seen == [jobs[0].entry.job_id, jobs[2].entry.job_id]
    assert await aredis.hget(KEYS.job(doomed), "status") == b"cancelled"
    assert await aredis.hget(KEYS.fair(stream), "held") == b"0"


async def test_a_cancelled_held_job_costs_its_tenant_no_turn(aredis: aioredis.Redis) -> None:
    """A tenant whose held jobs were mostly cancelled is served its live one on its own turn,
    not after the other tenant has had a job for each it lost."""
    config = _config(window=4)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "x") for _ in range(4)])  # the window
    a_jobs = [_job(config, "a") for _ in range(5)]
    await _enqueue(store, a_jobs)
    await _enqueue(store, [_job(config, "b") for _ in range(5)])
    for job in a_jobs[:4]:
        await store.transition(job.entry.job_id, JobStatus.CANCELLED)
    assert await _take_tenants(reader, stream, 4) == ["x"] * 4
    assert await _take_tenants(reader, stream, 4) == ["a", "b", "b", "b"]


@pytest.mark.parametrize(("weights", "shares"), [((1e-3,), (7,)), ((1e-3, 3e-3), (2, 6))])
async def test_tiny_weights_move_jobs_in_the_same_proportions_at_no_extra_cost(
    aredis: aioredis.Redis, weights: tuple[float, ...], shares: tuple[int, ...]
) -> None:
    """A weight of 0.001 adds a thousandth of a credit per turn: the turns that only add
    credit are skipped at once, not run a thousand times inside the script (which held the
    server for seconds at 1e-5, and for good at 1e-9)."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    tenants = [f"t{index}" for index in range(len(weights))]
    for tenant, weight in zip(tenants, weights, strict=True):
        await _enqueue(store, [_job(config, tenant, weight) for _ in range(8)])
    await _take_tenants(reader, stream, 1)  # the window's first job
    await aredis.config_resetstat()
    served: list[str] = []
    for _ in range(4):
        served += await _take_tenants(reader, stream, 2)
    assert [served.count(tenant) for tenant in tenants] == list(shares), served
    stats = await aredis.info("commandstats")
    assert stats.get("cmdstat_lmove", {"calls": 0})["calls"] < 40


async def test_a_weight_too_small_to_invert_holds_the_server_no_longer(
    aredis: aioredis.Redis,
) -> None:
    """A key stored before weights were held to 1e-9 may weigh 1e-310: the turns its tenant
    needs to a whole credit (1 / weight) overflowed to infinity, which no fast-forward took, so
    the first refill turned the ring for good and the server answered BUSY to every client
    until killed. Such a weight counts as 1e-9, as does one a lane recorded before."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "tiny", 1e-310) for _ in range(3)])
    assert float(await aredis.hget(KEYS.fair(stream), "w:tiny") or 0) == 1e-9
    await aredis.hset(KEYS.fair(stream), "w:tiny", "1e-310")  # recorded before the floor
    served: list[str] = []
    while more := await _take_tenants(reader, stream, 1):
        served += more
    assert served == ["tiny"] * 3


async def test_the_console_lists_held_jobs_beside_the_streams_entries(
    aredis: aioredis.Redis,
) -> None:
    """A backlogged fair lane's stream holds only its window: the console listed 2 queued jobs
    of 10, and none of the flooding tenant's held ones."""
    config = _config(window=2)
    store = JobStore(aredis, KEYS, 60)
    await _reader(aredis, config)
    jobs = [_job(config, "a") for _ in range(10)]
    for job in jobs:
        job.fields = {**job.fields, "tenant": "a"}  # as the producer writes it
    await _enqueue(store, jobs)
    listed = await recent_jobs(
        aredis, KEYS, ModelRepository({"m": config}), JobFilter(status="queued", tenant="a")
    )
    assert {row["id"] for row in listed} == {job.entry.job_id for job in jobs}


@dataclass
class _Served:
    """What a worker's own read path served: the micro-batches' sizes, the jobs it finished,
    and the TAKEs it sent."""

    sizes: list[int] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    takes: int = 0


@contextlib.asynccontextmanager
async def _serving(aredis: aioredis.Redis, config: ModelConfig) -> AsyncIterator[_Served]:
    """A worker's own read path (LaneScheduler, StreamReader, ResultWriter; no engine) serving
    `config`'s default partition, blocked in XREADGROUP on its empty lanes once this yields."""
    partition = Partition.of(KEYS, config, "default")
    reader = await _reader(aredis, config)
    events = JobEvents("redis://unused")
    writer = ResultWriter(aredis, KEYS, 60, events, WORKER)
    lanes = LaneScheduler(partition, reader, Reclaimer(aredis, KEYS, partition, WORKER, 60, events))
    served = _Served()
    take = reader.take

    async def counted_take(streams: list[str], count: int) -> MicroBatch | None:
        served.takes += 1
        return await take(streams, count)

    reader.take = counted_take  # type: ignore[method-assign]
    batch_size = config.max_batch_size_of("default")

    async def serve() -> None:
        while True:
            # blocks for less than the test client's socket timeout (redis-py's default 5 s), as
            # a worker's client (shared.redis_client.connect) times out beyond its block: a
            # longer block would cut the read, and end this worker, on a stalled machine
            for stream, batch in await lanes.next_batch(batch_size, 0, BLOCK_MS):
                served.sizes.append(len(batch))
                finishes = [partition.finish(d, JobStatus.SUCCEEDED, {}) for d in batch]
                served.done.extend(f.job_id for f in await writer.finish(stream, finishes))

    worker = asyncio.create_task(serve())
    await asyncio.sleep(0.3)  # blocked in XREADGROUP on both (empty) lanes
    try:
        yield served
    finally:
        # its blocked read's connection is dropped here, not in a later test; a bare cancel
        # can be lost (see cancel_and_wait), and awaiting the worker would then never return
        await cancel_and_wait(worker)
        # its variant statistics go now, not a second later in another test's command counts
        await writer.close()
        if not worker.cancelled():
            worker.result()  # the loop's own error, if it died before the cancel


async def _until_done(served: _Served, jobs: list[NewJob]) -> None:
    async def all_done() -> bool:
        return len(served.done) == len(jobs)

    await until_async(all_done, timeout=20)
    assert sorted(served.done) == sorted(j.entry.job_id for j in jobs)


async def _drained_batch_sizes(
    aredis: aioredis.Redis, config: ModelConfig, burst: int
) -> list[int]:
    """The micro-batches (their sizes) in which a worker's own read path, blocked on the empty
    lanes before the burst comes, serves a burst of `burst` jobs per tenant of "a" and "b" with
    `config`, once every one of them has run."""
    async with _serving(aredis, config) as served:
        jobs = [_job(config, tenant) for _ in range(burst) for tenant in ("a", "b")]
        await _enqueue(JobStore(aredis, KEYS, 60), jobs)
        await _until_done(served, jobs)
    partition = Partition.of(KEYS, config, "default")
    assert await aredis.hget(KEYS.fair(partition.online), "held") == b"0"
    return served.sizes


async def test_a_held_backlog_drains_under_a_worker_that_was_idle(aredis: aioredis.Redis) -> None:
    """The burst's first `window` jobs go straight into the stream and wake the worker; the
    rest are held. Every job must still run: each write-back keeps an entry in the stream, and
    each read moves a micro-batch in."""
    await _drained_batch_sizes(aredis, _config(window=4), burst=15)


async def test_after_a_short_first_read_a_fair_lane_is_read_in_full_batches(
    aredis: aioredis.Redis,
) -> None:
    """A window smaller than a micro-batch wakes the worker with a short batch, and a
    write-back keeps just one entry in the stream: a blocking read would keep finding one
    job. A fair lane's worker follows any read that found work with a TAKE, which moves a whole
    micro-batch in."""
    sizes = await _drained_batch_sizes(aredis, _config(window=2, batch=4), burst=15)
    assert sizes[0] <= 2 and all(size == 4 for size in sizes[1:-1]), sizes
    assert len(sizes) <= 9, sizes  # 30 jobs: the first read's 2, then full batches of 4


async def test_jobs_held_by_a_fair_producer_drain_under_a_worker_with_fair_queuing_off(
    aredis: aioredis.Redis,
) -> None:
    """A plain lane's write-back does not look for held jobs (a command per micro-batch), so
    jobs held by producers whose config has `queue.fair` on, under a worker whose config has it
    off (a rolling change), are moved in by the reclaimer's refill, and from the first entry
    round robin moved in, by TAKEs as in a fair lane: every one runs."""
    fair = _config(window=2)
    plain = ModelConfig(
        name="m",
        kind="batch",
        backend="identity",
        max_batch_size=4,
        queue=QueueLimits(visibility_timeout_s=1),
    )
    async with _serving(aredis, plain) as served:
        jobs = [_job(fair, tenant) for _ in range(15) for tenant in ("a", "b")]
        await _enqueue(JobStore(aredis, KEYS, 60), jobs)
        await _until_done(served, jobs)
    assert await aredis.hget(KEYS.fair(KEYS.queue("m", "default")), "held") == b"0"
    assert served.takes > 0 and max(served.sizes) == 4, served


async def test_a_quiet_fair_lane_is_read_once_per_micro_batch(aredis: aioredis.Redis) -> None:
    """Jobs that come one at a time go straight into an idle fair lane's stream, and the
    worker's blocking read hands each one over: with nothing held, no TAKE follows it."""
    config = _config(window=4)
    store = JobStore(aredis, KEYS, 60)
    async with _serving(aredis, config) as served:
        jobs: list[NewJob] = []
        for tenant in ("a", "b", "a", "b", "a"):
            jobs.append(_job(config, tenant))
            await _enqueue(store, jobs[-1:])
            await _until_done(served, jobs)
    assert served.sizes == [1] * 5 and served.takes == 0, served


async def test_a_newcomer_is_read_by_the_first_take_after_it_arrives(
    aredis: aioredis.Redis,
) -> None:
    """Only a read moves a micro-batch's worth of held jobs into the stream; a write-back
    moves one, to wake a blocked worker. So a tenant arriving beside a flood is not queued
    behind a window of the flood committed to the stream before it came."""
    config = _config(window=4)
    partition = Partition.of(KEYS, config, "default")
    reader = await _reader(aredis, config)
    writer = ResultWriter(aredis, KEYS, 60, JobEvents("redis://unused"), WORKER)
    store = JobStore(aredis, KEYS, 60)
    stream = partition.online
    await _enqueue(store, [_job(config, "a") for _ in range(24)])  # 4 in the stream, 20 held
    taken = await reader.take([stream], 4)
    assert taken is not None and len(taken[1]) == 4
    assert not any(d.moved for d in taken[1])  # the window's, never held
    await writer.finish(stream, [partition.finish(d, JobStatus.SUCCEEDED, {}) for d in taken[1]])
    assert await aredis.xlen(stream) == 1  # the write-back moved one of a's jobs in, not four
    await _enqueue(store, [_job(config, "b")])
    moved = await reader.take([stream], 4)
    assert moved is not None and "b" in [d.entry.tenant for d in moved[1] if d.entry]
    assert all(d.moved for d in moved[1])  # a TAKE's rows say so too: their write-back refills


async def test_a_replayed_dead_letter_keeps_its_tenants_weight(aredis: aioredis.Redis) -> None:
    """A replay records no API key, so no weight: it was enqueued at weight 1, which then
    served the tenant's whole held backlog (the weight is the tenant's, not the job's) 1:1."""
    config = _config(window=1)
    store, reader, stream = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a", 3.0) for _ in range(12)])
    await _enqueue(store, [_job(config, "b", 1.0) for _ in range(12)])
    died = RequestEntry(uuid.uuid4().hex, {"inputs": {"t": "a"}}, now_ms(), tenant="a")
    letter = {"entry": "1-0", "lane": stream, "reason": "crashed", "deliveries": 3}
    await aredis.xadd(KEYS.dlq("m", "default"), {**letter, **died.encode()})  # type: ignore[arg-type]
    letters = DeadLetters(store, KEYS, "m", "default", config.fair_window_of("default"))
    assert len((await letters.replay()).replayed) == 1
    await _take_tenants(reader, stream, 1)  # the window's first job
    served = await _take_tenants(reader, stream, 4) + await _take_tenants(reader, stream, 4)
    assert (served.count("a"), served.count("b")) == (6, 2), served


async def test_a_take_moves_no_micro_batch_into_a_lane_it_does_not_read(
    aredis: aioredis.Redis,
) -> None:
    """On the bulk lane's turn TAKE refilled the online lane up to a micro-batch too, then read
    bulk: the flood's jobs it moved in were committed ahead of a tenant that came next, which
    waited a micro-batch more. A lane after the one read gets one entry at most (a worker that
    blocks on it next is woken)."""
    config = _config(window=1)
    partition = Partition.of(KEYS, config, "default")
    store, reader, online = await _lane(aredis, config)
    await _enqueue(store, [_job(config, "a") for _ in range(12)])
    assert len(await _take_tenants(reader, online, 4)) == 4
    fields: dict[str, str | int] = {"model": "m", "variant": "default"}
    bulk = [NewJob(_job(config, "x").entry, partition.bulk, fields) for _ in range(2)]
    await _enqueue(store, bulk)
    taken = await reader.take([partition.bulk, online], 4)
    assert taken is not None and taken[0] == partition.bulk and len(taken[1]) == 2
    pending = (await aredis.xpending(online, GROUP))["pending"]
    assert await aredis.xlen(online) - pending == 1
    await _enqueue(store, [_job(config, "b")])
    taken = await reader.take([online, partition.bulk], 4)
    assert taken is not None and "b" in [d.entry.tenant for d in taken[1] if d.entry], taken


@pytest.fixture
def cli_on_test_server(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The CLI, run in this process, pointed at the test server: a process reads its settings
    once (cached), so the cache is cleared on the way in and on the way out."""
    url = redis_client.connection_pool.connection_kwargs
    monkeypatch.setenv("CONVEYOR_REDIS_URL", f"redis://{url['host']}:{url['port']}/0")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.usefixtures("cli_on_test_server")
def test_a_weight_must_be_a_positive_number(redis_client: redis.Redis) -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1001.0, 1e-310):
        with pytest.raises(InvalidKeySpec, match="weight"):
            KeySpec(tenant="acme", scopes=frozenset({"submit"}), weight=bad).check()
    connected = redis_client.info("clients")["connected_clients"]  # other tests' clients too
    refused = CliRunner().invoke(keys_command, ["create", "--tenant", "acme", "--weight", "0"])
    assert (
        refused.exit_code == 2 and "weight 0.0 must be a number in [1e-09, 1000]" in refused.output
    )
    assert not redis_client.smembers(CLI_KEYS.api_key_index)  # nothing stored
    made = CliRunner().invoke(keys_command, ["create", "--tenant", "acme", "--weight", "2.5"])
    assert made.exit_code == 0, made.output
    [key_id] = redis_client.smembers(CLI_KEYS.api_key_index)
    assert redis_client.hget(CLI_KEYS.api_key(as_text(key_id)), "weight") == b"2.5"
    # the CLI's client closes its connections as it ends: none outlives the command
    assert redis_client.info("clients")["connected_clients"] <= connected
