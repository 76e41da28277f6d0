"""Group commit on a real Valkey: commands issued in one event-loop turn reach Redis as one
pipeline (one read on the server, one flush), each caller gets its own reply or its own error,
and the order in which commands were issued is the order they run in."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from urllib.parse import urlsplit

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI
from redis.exceptions import ResponseError

from conveyor.embedded_valkey import start_embedded_valkey
from producer_api.app import create_app
from producer_api.jobs.group_commit import FLUSHES, group_committing
from shared.api_keys import ApiKeyStore, KeySpec
from shared.codec import RequestEntry, as_text, loads
from shared.job_states import JobStatus
from shared.job_store import JobStore, QueueFull, now_ms
from shared.keys import Keys, new_job_id
from shared.rate_limit import (
    IN_FLIGHT,
    TOKEN_BUCKET,
    BucketState,
    InFlightLimiter,
    Quota,
    RateLimiter,
)
from shared.redis_client import ReplicaAckTimeout, connect, preload
from shared.settings import get_settings
from tests.conftest import REPO_ROOT, own_valkey, until_async


def _entry() -> RequestEntry:
    return RequestEntry(uuid.uuid4().hex, {"inputs": {"text": "x"}}, now_ms())


async def _reads(client: aioredis.Redis) -> int:
    """Commands the server has read from its clients' sockets (INFO counts itself as one)."""
    return int((await client.info("stats"))["total_reads_processed"])


@pytest.fixture
async def alone() -> AsyncIterator[aioredis.Redis]:
    """A client of a Valkey no one else uses: the session's counted a read of another test's
    client left running (`make test` runs the tests on two workers, in another order)."""
    with own_valkey() as url:
        client = aioredis.Redis.from_url(url)
        yield client
        await client.aclose()


async def test_one_turn_of_enqueues_is_one_round_trip(alone: aioredis.Redis) -> None:
    aredis = alone
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await hot.ping()  # connect the pool and load nothing yet: the flush below is the first
    await store.create(_entry(), "cv:q:warm", {"model": "m"})  # the script is loaded now
    flushes = FLUSHES._value.get()
    reads = await _reads(aredis)
    entries = [_entry() for _ in range(20)]
    await asyncio.gather(*(store.create(e, "cv:q:m", {"model": "m"}) for e in entries))
    after = await _reads(aredis)
    assert FLUSHES._value.get() - flushes == 1
    assert after - reads == 2  # the pipeline and the second INFO
    assert await aredis.xlen("cv:q:m") == 20
    for entry in entries:
        assert await aredis.hget(Keys("cv").job(entry.job_id), "status") == b"queued"


async def test_a_refused_or_failing_command_fails_alone(aredis: aioredis.Redis) -> None:
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await aredis.set("cv:plain", "not a list")
    await store.create(_entry(), "cv:q:warm", {"model": "m"})  # the script is loaded now
    flushes = FLUSHES._value.get()
    results = await asyncio.gather(
        *(store.create(_entry(), "cv:q:small", {"model": "m"}, max_length=3) for _ in range(5)),
        hot.lpush("cv:plain", "x"),  # WRONGTYPE
        hot.incr("cv:counter"),
        return_exceptions=True,
    )
    assert FLUSHES._value.get() - flushes == 1
    assert results[:3] == [0, 1, 2]  # each one's queue position: the jobs ahead of it
    assert all(isinstance(r, QueueFull) and r.length == 3 for r in results[3:5])
    assert isinstance(results[5], ResponseError) and "WRONGTYPE" in str(results[5])
    assert results[6] == 1
    assert await aredis.xlen("cv:q:small") == 3


async def test_issue_order_is_kept_within_a_turn_and_per_caller(aredis: aioredis.Redis) -> None:
    hot = group_committing(aredis, "", "hot")

    async def caller(name: str) -> list[str]:
        await hot.rpush("cv:log", f"{name}-1")
        await hot.rpush("cv:log", f"{name}-2")
        return [v for v in map(as_text, await hot.lrange("cv:log", 0, -1)) if v[:2] == name]

    seen = await asyncio.gather(*(caller(f"c{i}") for i in range(5)))
    for i, mine in enumerate(seen):
        assert mine == [f"c{i}-1", f"c{i}-2"]
    log = [as_text(v) for v in await aredis.lrange("cv:log", 0, -1)]
    assert log == [f"c{i}-1" for i in range(5)] + [f"c{i}-2" for i in range(5)]


async def test_a_lost_script_is_loaded_again(aredis: aioredis.Redis) -> None:
    """A restarted Redis forgets its scripts: every caller of the batch reloads and retries."""
    hot = group_committing(aredis, "", "hot")
    store = JobStore(hot, Keys("cv"), 60)
    await store.create(_entry(), "cv:q:m", {"model": "m"})
    await aredis.script_flush()
    await asyncio.gather(*(store.create(_entry(), "cv:q:m", {"model": "m"}) for _ in range(4)))
    assert await aredis.xlen("cv:q:m") == 5


async def test_a_lone_command_gets_its_own_reply_or_error(aredis: aioredis.Redis) -> None:
    """A turn of one command (a quiet producer's) is sent without a pipeline, as it was
    issued: its error is still its caller's, and the client goes on."""
    hot = group_committing(aredis, "", "hot")
    await aredis.set("cv:plain", "not a list")
    flushes = FLUSHES._value.get()
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await hot.lpush("cv:plain", "x")
    assert await hot.incr("cv:counter") == 1
    assert FLUSHES._value.get() - flushes == 2


async def test_a_short_replica_wait_fails_the_writes_it_waited_for_alone(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica to confirm (the test Valkey has none), a
    flush's WAIT falls short: the write it waited for fails, a read beside it gets its reply,
    and the rate limiter's and the in-flight limit's scripts wait for no replica. One short
    WAIT failed the whole flush (as a socket timeout: the WAIT gave up no sooner than the
    producer's client), and every request behind the rate limit answered 503."""
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    plain = connect(redis_url, name="acked", blocks_ms=0)  # as the producer's
    hot = group_committing(plain, redis_url, "hot")
    keys, quota = Keys("cv"), Quota(rate_per_s=10, burst=10, max_in_flight=1, max_streams=1)
    await aredis.set("cv:read", "value")
    await preload(aredis, [TOKEN_BUCKET, IN_FLIGHT])  # one flush, with no reruns after it
    await aredis.config_resetstat()
    try:
        written, read, bucket, slot = await asyncio.gather(
            hot.set("cv:written", 1),
            hot.get("cv:read"),
            RateLimiter(hot, keys).take("key", quota),
            InFlightLimiter(hot, keys, 60).admit("key", "job", quota.max_in_flight),
            return_exceptions=True,
        )
    finally:
        await plain.aclose()
    assert isinstance(written, ReplicaAckTimeout), repr(written)
    assert read == b"value"
    assert isinstance(bucket, BucketState) and bucket.allowed, repr(bucket)
    assert slot is True
    waits = (await aredis.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0)
    assert waits == 1


async def _acked_app(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> tuple[str, str, FastAPI]:
    """A new tenant, its key (submit, read), and an app on `redis_url` asking one replica's
    ack, which none gives (the key stored before: its creation would wait for one too)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    spec = KeySpec(tenant=tenant, scopes=frozenset({"submit", "read"}))
    api_key, _ = await ApiKeyStore(aredis, Keys()).create(spec)
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    settings = get_settings().model_copy(update={"redis_url": redis_url, "instance_id": "acked"})
    return tenant, api_key, create_app(settings)


async def test_an_api_with_unconfirmed_writes_still_answers_reads(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica, only writes that need one fail: every
    authenticated request takes a token from its key's bucket, and a queued job's view reads
    its position, both scripts; each ended in a WAIT, so reading a job answered 503."""
    tenant, api_key, app = await _acked_app(redis_url, aredis, settings_env)
    entry = RequestEntry(new_job_id("identity", "default"), {"inputs": {}}, now_ms(), tenant=tenant)
    fields = {"model": "identity", "variant": "default"}
    auth = {"Authorization": f"Bearer {api_key}"}
    async with app.router.lifespan_context(app):
        await JobStore(aredis, Keys(), 60).create(
            entry, Keys().queue("identity", "default"), fields
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            job = await client.get(f"/v1/jobs/{entry.job_id}", headers=auth)
            models = await client.get("/v1/models", headers=auth)
            submit = await client.post(
                "/v1/jobs", json={"model": "identity", "inputs": {}}, headers=auth
            )
    assert job.status_code == 200, job.text
    assert job.json()["status"] == "queued" and "queue_position" in job.json(), job.text
    assert models.status_code == 200, models.text
    assert submit.status_code == 503, submit.text  # its job was not confirmed


async def test_a_cancel_no_replica_confirmed_is_neither_answered_nor_announced(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica, a cancel is refused (503) and its job's
    waiters hear nothing of it. TRANSITION ran on a pipeline without WAIT and published the end
    itself: a long-poll answered `cancelled` and DELETE 200 for a cancel that a failover undid,
    the job back `queued`, to run."""
    tenant, api_key, app = await _acked_app(redis_url, aredis, settings_env)
    channel = f"reply-{uuid.uuid4().hex}"  # one the API subscribes when a long-poll follows it
    job_id = new_job_id("identity", "default")
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms(), tenant=tenant, reply=channel)
    auth = {"Authorization": f"Bearer {api_key}"}
    async with app.router.lifespan_context(app):
        await JobStore(aredis, Keys(), 60).create(
            entry, Keys().queue("identity", "default"), {"model": "identity"}
        )
        await aredis.config_resetstat()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            poll = asyncio.create_task(client.get(f"/v1/jobs/{job_id}?wait=30", headers=auth))
            while not (await aredis.pubsub_shardnumsub(channel))[0][1]:
                await asyncio.sleep(0.01)  # the long-poll read the job, and follows its channel
            cancel = await client.delete(f"/v1/jobs/{job_id}", headers=auth)
            await asyncio.sleep(0.5)  # time enough for a published end to reach the long-poll
            heard = poll.done()
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll
    assert cancel.status_code == 503, cancel.text
    assert not heard, poll.result().text
    waits = (await aredis.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0)
    assert waits >= 1


async def test_a_cancel_a_replica_confirmed_is_announced(
    aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and a replica, a group-committed cancel waits for it, then
    tells the job's waiters itself (TRANSITION publishes nothing then)."""
    settings_env(CONVEYOR_REPLICA_ACKS="1")
    port = aredis.connection_pool.connection_kwargs["port"]
    replica = start_embedded_valkey(config={"replicaof": f"127.0.0.1 {port}"})
    hot = group_committing(aredis, "", "hot")
    channel = f"reply-{uuid.uuid4().hex}"
    entry = RequestEntry(uuid.uuid4().hex, {"inputs": {}}, now_ms(), reply=channel)
    pubsub = aredis.pubsub()
    try:
        await until_async(_replica_online(aredis))
        await JobStore(aredis, Keys(), 60).create(entry, Keys().queue("identity", "default"), {})
        await pubsub.ssubscribe(channel)
        await until_async(partial(pubsub.get_message, False, 1))  # subscribed
        await aredis.config_resetstat()
        record = await JobStore(hot, Keys(), 60).transition(entry.job_id, JobStatus.CANCELLED)
        heard = await until_async(partial(pubsub.get_message, False, 1))
    finally:
        await pubsub.aclose()
        replica.stop()
    assert record.status == JobStatus.CANCELLED
    assert loads(heard["data"])["status"] == "cancelled"
    waits = (await aredis.info("commandstats")).get("cmdstat_wait", {}).get("calls", 0)
    assert waits == 1


def _replica_online(client: aioredis.Redis) -> Callable[[], Awaitable[bool]]:
    """A check that `client`'s server has a replica in sync."""

    async def online() -> bool:
        replication = await client.info("replication")
        return "online" in str(replication.get("slave0", ""))

    return online


async def test_in_flight_slots_are_given_back_without_a_replica(
    redis_url: str, aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica, the in-flight limit's removals wait for no
    replica, as its admission: they were plain ZREMs, which group commit waited for, so a key at
    its cap was answered 503 where a dead submit's slot was free (the prune failed), and a
    submit's give-back raised over the refusal it followed."""
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    plain = connect(redis_url, name="acked", blocks_ms=0)  # as the producer's
    limiter = InFlightLimiter(group_committing(plain, redis_url, "hot"), Keys("gc"), 60)
    slots = Keys("gc").in_flight("key")
    await aredis.zadd(slots, {"died": now_ms() - InFlightLimiter.GRACE_MS - 1_000})  # no hash
    try:
        assert await limiter.admit("key", "j2", 1)
        await limiter.release("key", "j2")
    finally:
        await plain.aclose()
    assert await aredis.zcard(slots) == 0


async def test_a_give_back_that_fails_leaves_the_refusal_it_followed(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """A submit refused (its queue full) gives its in-flight slot back; when that fails (here
    its server refuses ZREM to the producer's user) the slot is left to the prune and the
    client still hears 429, not the give-back's error."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    api_key, _ = await ApiKeyStore(aredis, Keys()).create(
        KeySpec(tenant=tenant, scopes=frozenset({"submit"}))
    )
    store, stream = JobStore(aredis, Keys(), 60), Keys().queue("tiny", "default")
    for _ in range(5):  # tiny's queue.max_length
        await store.create(_entry(), stream, {})
    await aredis.execute_command("ACL SETUSER no-zrem on >pw ~* &* +@all -zrem")
    url = urlsplit(redis_url)
    settings = get_settings().model_copy(
        update={
            "redis_url": url._replace(netloc=f"no-zrem:pw@{url.hostname}:{url.port}").geturl(),
            "instance_id": "no-zrem",
            "model_repository": REPO_ROOT / "tests/fixtures/model_repository",
        }
    )
    app = create_app(settings)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                submit = await client.post(
                    "/v1/jobs",
                    json={"model": "tiny", "inputs": {}},
                    headers={"Authorization": f"Bearer {api_key}"},
                )
    finally:
        await aredis.acl_deluser("no-zrem")
    assert submit.status_code == 429, submit.text
    assert submit.json()["error"]["type"] == "queue_full"
