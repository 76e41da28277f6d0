"""What the worker's hot path costs Redis, counted by the server itself (INFO commandstats, which
counts the commands Lua scripts run) on a real Valkey, without a stack: FINISH does two
commands per job (three for one that ran long after its creation) and one PUBLISH per waiting
producer, and an idle worker's read goes straight to
its blocking XREADGROUP, with no empty TAKE and no claim round trip after it."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from shared import job_scripts
from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.redis_client import preload
from workers.batching.micro_batch_loop import MicroBatchLoop
from workers.engines.identity_engine import IdentityEngine
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import Delivery, StreamReader

KEYS = Keys("t:")
STREAM = KEYS.queue("m", "v")
WORKER = "worker-1"


async def _commands(client: aioredis.Redis) -> Counter[str]:
    stats: dict[str, Any] = await client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})


async def _enqueue(client: aioredis.Redis, jobs: list[tuple[str, str, str]]) -> None:
    """(job id, reply channel, in-flight set) each; the set as the producer records it."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id, reply, slot in jobs:
        entry = RequestEntry(job_id, {"inputs": {"x": job_id}}, now_ms(), reply=reply)
        entry.inflight = slot
        fields: dict[str, str | int] = {"model": "m", "variant": "v"}
        if slot:
            fields["inflight"] = slot
            await client.zadd(slot, {job_id: now_ms()})
        await store.create(entry, STREAM, fields)


def _writer(client: aioredis.Redis) -> ResultWriter:
    return ResultWriter(client, KEYS, 60, JobEvents("redis://unused"), WORKER)


def _succeeded(delivery: Delivery) -> Finish:
    assert delivery.entry is not None
    partition = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
    outputs = {"outputs": '{"y": 1}'}
    return partition.finish(delivery, JobStatus.SUCCEEDED, outputs)


async def test_finish_costs_two_commands_per_job_and_one_publish_per_producer(
    aredis: aioredis.Redis,
) -> None:
    jobs = [(f"j{i}", f"t:reply:p{i % 2}", f"t:inflight:k{i % 3}") for i in range(12)]
    await _enqueue(aredis, [*jobs, ("gone", "t:reply:p0", ""), ("cancelled", "t:reply:p0", "")])
    await aredis.delete(KEYS.job("gone"))
    reader = StreamReader(aredis, KEYS, [STREAM], WORKER)
    await reader.ensure_groups()
    (_, deliveries), *_ = await reader.wait([STREAM], 100, 100)
    # cancelled once its entry was read (before, the cancel withdraws the entry: no read)
    await JobStore(aredis, KEYS, 60).transition("cancelled", JobStatus.CANCELLED)
    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe("t:reply:p0", "t:reply:p1")
    await preload(aredis, job_scripts.ALL)  # as a worker does when it starts
    await aredis.config_resetstat()

    writer = _writer(aredis)
    written = await writer.finish(STREAM, [_succeeded(d) for d in deliveries])

    calls = await _commands(aredis)
    await writer.close()  # its variant statistics, gathered for a second, go now
    assert sorted(f.job_id for f in written) == sorted(job_id for job_id, _, _ in jobs)
    # one HMGET per entry, one HSET per written job (its hash keeps the TTL its enqueue set a
    # moment ago; the cancelled job's result, made for no one, is dropped), no look at the fair
    # hash (a plain lane: nothing round robin moved in); EXPIREs at most the drained counter's
    # (first write of a second) and the variant statistics' two
    assert calls["hmget"] == 14 and calls["hset"] == 12 and calls["expire"] <= 3
    assert calls["hget"] == 0 and calls["hincrby"] == 0
    assert calls["spublish"] == 2 and calls["zrem"] == 3 and calls["xack"] == calls["xdel"] == 1
    messages: list[dict[str, Any]] = []
    for _ in range(100):  # subscribe confirmations read as None
        if len(messages) == 2:
            break
        if (message := await pubsub.get_message(timeout=0.05)) is not None:
            messages.append(message)
    await pubsub.aclose()
    by_channel = {m["channel"]: loads(m["data"]) for m in messages}
    assert sorted(v["id"] for v in by_channel[b"t:reply:p0"]) == sorted(
        f"j{i}" for i in range(0, 12, 2)
    )
    assert {v["status"] for v in by_channel[b"t:reply:p1"]} == {"succeeded"}
    assert [await aredis.zcard(f"t:inflight:k{k}") for k in range(3)] == [0, 0, 0]
    job = await aredis.hgetall(KEYS.job("j0"))
    assert job[b"status"] == b"succeeded" and job[b"writes"] == b"1"
    assert job[b"worker"] == WORKER.encode() and job[b"attempts"] == b"1"
    assert await aredis.hget(KEYS.job("cancelled"), "status") == b"cancelled"
    assert not await aredis.exists(KEYS.job("gone"))
    assert await aredis.xlen(STREAM) == 0


async def test_a_second_finish_of_the_same_jobs_writes_nothing(aredis: aioredis.Redis) -> None:
    await _enqueue(aredis, [("once", "", "")])
    reader = StreamReader(aredis, KEYS, [STREAM], WORKER)
    await reader.ensure_groups()
    (_, deliveries), *_ = await reader.wait([STREAM], 10, 100)
    writer = _writer(aredis)
    first = await writer.finish(STREAM, [_succeeded(d) for d in deliveries])
    again = await writer.finish(STREAM, [_succeeded(d) for d in deliveries])
    await writer.close()
    assert [f.job_id for f in first] == ["once"] and again == []
    assert await aredis.hget(KEYS.job("once"), "writes") == b"1"


async def test_an_idle_worker_blocks_at_once_and_claims_nothing_after(
    aredis: aioredis.Redis,
) -> None:
    reader = StreamReader(aredis, KEYS, [STREAM, f"{STREAM}:bulk"], WORKER)
    await reader.ensure_groups()
    await aredis.config_resetstat()
    waiting = asyncio.create_task(reader.wait([STREAM, f"{STREAM}:bulk"], 64, 5_000))
    await asyncio.sleep(0.2)
    await _enqueue(aredis, [("lone", "", "")])
    batches = await waiting
    calls = await _commands(aredis)
    assert [[d.entry.job_id for d in b[1] if d.entry] for b in batches] == [["lone"]]
    assert calls["evalsha"] == 1  # the producer's ENQUEUE; no TAKE before, no CLAIM after
    assert calls["xreadgroup"] == 1


async def test_a_result_finish_refused_counts_as_no_finished_job(aredis: aioredis.Redis) -> None:
    """A job cancelled while a blocking read handed it over runs all the same, and FINISH
    refuses its result: it counted as a job succeeded here (a rerun after a reclaim, twice)."""
    config = ModelConfig(name="m", kind="batch", backend="identity")
    partition = Partition.of(KEYS, config, "default")
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id in ("late", "kept"):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
        await store.create(entry, partition.online, {"model": "m", "variant": "default"})
    reader = StreamReader(aredis, KEYS, partition.streams, WORKER)
    await reader.ensure_groups()
    [(stream, deliveries)] = await reader.wait(partition.streams, 10, 100)
    await store.transition("late", JobStatus.CANCELLED)
    reclaimer = Reclaimer(aredis, KEYS, partition, WORKER, 60, JobEvents("redis://unused"))
    lanes = LaneScheduler(partition, reader, reclaimer)
    engine = IdentityEngine(config, "default", "")
    writer = _writer(aredis)
    loop = MicroBatchLoop(partition, lanes, reader, writer, engine, block_ms=100)
    labels = {"model": "m", "variant": "default", "state": "succeeded"}
    before = REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels) or 0.0
    await loop.process(stream, deliveries)
    await writer.close()  # its statistics' timer outlived the test, firing in a later one
    after = REGISTRY.get_sample_value("conveyor_jobs_finished_total", labels)
    assert after == before + 1  # "kept"; "late" stays cancelled
    assert await aredis.hget(KEYS.job("late"), "status") == b"cancelled"


async def test_finish_renews_the_ttl_only_of_jobs_created_before_the_slack(
    aredis: aioredis.Redis,
) -> None:
    """A write-back soon after a job's enqueue leaves its hash the TTL the enqueue set (no
    EXPIRE); a job created longer ago than the slack (a tenth of the TTL, a minute at most) has
    its hash's life renewed to the whole TTL from its end."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    for job_id, age_ms in (("fresh", 0), ("old", 7_000)):
        entry = RequestEntry(job_id, {"inputs": {}}, now_ms() - age_ms)
        await store.create(entry, STREAM, {"model": "m", "variant": "v"})
        await aredis.expire(KEYS.job(job_id), 30)  # as if time had passed since
    reader = StreamReader(aredis, KEYS, [STREAM], WORKER)
    await reader.ensure_groups()
    (_, deliveries), *_ = await reader.wait([STREAM], 10, 100)
    writer = _writer(aredis)
    written = await writer.finish(STREAM, [_succeeded(d) for d in deliveries])
    await writer.close()
    assert sorted(f.job_id for f in written) == ["fresh", "old"]
    assert 0 < await aredis.ttl(KEYS.job("fresh")) <= 30
    assert 50 < await aredis.ttl(KEYS.job("old")) <= 60
