"""How a batch leaves the active index when something else is going on. An early end races
another caller's finalization: a cancel settles a batch's open items, then counts them, and the
sweeper, the console or a second producer can count the same settled items first and begin
finalizing. The cancel must still answer with the batch ended `cancelled` (CI once saw
`finalizing`). And a batch whose keys expired before it ended leaves the index without joining
the ended one, which the console reads every second."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from producer_api.app import create_app
from producer_api.batch_api.progress import BatchApiProgress
from producer_api.batch_api.sweeper import COMPLETE_AFTER_MS, BatchApiSweeper
from producer_api.state import ProducerState
from shared.batch_api_store import BatchApiStore, BatchStatus, Refresh
from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id
from shared.redis_client import ReplicaAckTimeout
from shared.settings import Settings, get_settings
from shared.webhook_events import WebhookDispatcher
from tests.conftest import until_async

KEYS = Keys()
TTL_S = 600
ITEMS = 5
WEBHOOKS = WebhookDispatcher("redis://unused")  # the batch has no webhook: never sent


class _GatedFinish(BatchApiStore):
    """The other caller's store: its finalization waits for the gate, as a slow one would."""

    def __init__(self, client: aioredis.Redis, gate: asyncio.Event) -> None:
        super().__init__(client, KEYS, TTL_S)
        self.gate = gate

    async def finish(self, batch_id: str, status: BatchStatus) -> BatchStatus:
        await self.gate.wait()
        return await super().finish(batch_id, status)


class _RacedSettle(JobStore):
    """The cancelling producer's job store: right after it settles the items, the other caller
    counts them and begins finalizing (held at the gate, released 0.3 s later)."""

    def __init__(self, client: aioredis.Redis, other: BatchApiProgress, gate: asyncio.Event):
        super().__init__(client, KEYS, TTL_S)
        self.other, self.gate = other, gate
        self.batch_id = ""
        self.racer: asyncio.Task[Refresh | None] | None = None

    async def settle_many(
        self, job_ids: Sequence[str], target: JobStatus, fields: Mapping[str, str | int]
    ) -> int:
        moved = await super().settle_many(job_ids, target, fields)
        self.racer = asyncio.create_task(self.other.refresh(self.batch_id, window=0))
        store = BatchApiStore(self.redis, KEYS, TTL_S)
        await until_async(lambda: _finalizing(store, self.batch_id), every=0.01)
        asyncio.get_running_loop().call_later(0.3, self.gate.set)
        return moved


async def _finalizing(store: BatchApiStore, batch_id: str) -> bool:
    fields = await store.read(batch_id)
    return fields is not None and fields["status"] == BatchStatus.FINALIZING


async def _running_batch(store: BatchApiStore, jobs: JobStore) -> str:
    """A running batch of ITEMS queued items in one partition, enqueued as the Batch API does."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    open_list = KEYS.batch_open(batch_id, "identity", "default")
    ids = [new_job_id("identity", "default") for _ in range(ITEMS)]
    await store.create(batch_id, {"tenant": "default", "total": ITEMS}, TTL_S)
    fields = {"model": "identity", "variant": "default", "batch": batch_id}
    stream = KEYS.bulk_queue("identity", "default")
    new = [NewJob(RequestEntry(job_id, {"inputs": {}}, now_ms()), stream, fields) for job_id in ids]
    assert await jobs.create_many(new) == []
    await store.add_items(batch_id, [(job_id, open_list) for job_id in ids], [], TTL_S)
    await store.start(batch_id, [open_list], ITEMS, {"invalid": 0}, now_ms() + TTL_S * 1000)
    return batch_id


async def test_a_cancel_that_meets_another_finalizer_returns_with_the_batch_cancelled(
    aredis: aioredis.Redis,
) -> None:
    gate = asyncio.Event()
    other = BatchApiProgress(JobStore(aredis, KEYS, TTL_S), _GatedFinish(aredis, gate), WEBHOOKS)
    jobs = _RacedSettle(aredis, other, gate)
    store = BatchApiStore(aredis, KEYS, TTL_S)
    batch_id = jobs.batch_id = await _running_batch(store, jobs)

    assert await BatchApiProgress(jobs, store, WEBHOOKS).end(batch_id, BatchStatus.CANCELLED) == (
        BatchStatus.CANCELLED
    )
    fields = await store.read(batch_id)
    assert fields is not None and fields["status"] == "cancelled", fields
    assert fields["n_cancelled"] == str(ITEMS) and fields["open"] == "0"
    assert jobs.racer is not None
    raced = await jobs.racer  # the other caller finalized it; the cancel waited for that
    assert raced is not None and raced.finalize


async def test_a_batch_whose_keys_expired_leaves_the_index_and_is_not_listed_as_ended(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    ended = await _running_batch(store, jobs)
    await BatchApiProgress(jobs, store, WEBHOOKS).end(ended, BatchStatus.CANCELLED)
    await aredis.delete(KEYS.batch(batch_id))  # its TTL ran out, or an operator's DEL

    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    assert await store.active() == []
    assert await store.ended_since(0) == [ended]


async def test_recording_a_batchs_items_again_lists_each_once(aredis: aioredis.Redis) -> None:
    """redis-py reruns a pipeline whose connection dropped before its reply: the items were
    then listed twice, the output file repeated every line, and a partition counted twice
    could end the batch while another's items still ran."""
    store = BatchApiStore(aredis, KEYS, TTL_S)
    batch_id = f"batch_{uuid.uuid4().hex}"
    first, second = (KEYS.batch_open(batch_id, "identity", v) for v in ("a", "b"))
    items = [("j1", first), ("j2", second), ("j3", first)]
    for _ in range(2):
        await store.add_items(batch_id, items, [b'{"line": 4}'], TTL_S)
    assert await aredis.lrange(KEYS.batch_items(batch_id), 0, -1) == [b"j1", b"j2", b"j3"]
    assert await aredis.lrange(first, 0, -1) == [b"j1", b"j3"]
    assert await aredis.lrange(second, 0, -1) == [b"j2"]
    assert await aredis.llen(KEYS.batch_rejected(batch_id)) == 1


class _Broker(WebhookDispatcher):
    """Celery's side of a webhook hand-over: records each hand-over, or refuses them all (a
    broker that is down, as one is when its producer dies mid-finalization)."""

    def __init__(self, refuses: bool) -> None:
        super().__init__("redis://unused")
        self.refuses = refuses
        self.sent: list[tuple[str, str, str, str]] = []

    def send(self, kind: Any, target_id: str, url: str, body: dict[str, Any]) -> None:
        if self.refuses:
            raise RuntimeError("broker unreachable")
        self.sent.append((kind, target_id, body["type"], body["id"]))


async def test_a_batch_whose_finalizer_died_after_its_commit_still_sends_its_webhook(
    aredis: aioredis.Redis,
) -> None:
    """The commit released the batch from the active index before its webhook was handed
    over; a finalizer that died in between (here: its broker refused) lost the webhook for
    good, as the sweeper only released what was still indexed. A refused hand-over fails
    nothing either: it raised, and the cancel (or a read that finalized) answered 500."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    await store.set_fields(batch_id, {"webhook": "https://hooks.example.com/batches"})
    dying = BatchApiProgress(jobs, store, _Broker(refuses=True))
    assert await dying.end(batch_id, BatchStatus.CANCELLED) == BatchStatus.CANCELLED
    assert (await store.read(batch_id) or {})["status"] == BatchStatus.CANCELLED
    broker = _Broker(refuses=False)
    sweeper = BatchApiSweeper(store, BatchApiProgress(jobs, store, broker))
    await sweeper.sweep()
    assert broker.sent == []  # just committed: its finalizer may be handing it over now
    await store.set_fields(batch_id, {"cancelled_at": now_ms() - COMPLETE_AFTER_MS})
    await sweeper.sweep()
    await sweeper.sweep()  # released by the first: nothing sent again
    event_id = f"evt_{batch_id}_cancelled"  # the same whoever hands it over: receivers dedupe
    assert broker.sent == [("batch", batch_id, "batch.cancelled", event_id)]
    assert await store.active() == []
    assert (await store.read(batch_id) or {})["webhook_status"] == "pending"


async def test_a_batch_failed_at_create_whose_webhook_was_refused_still_sends_it(
    aredis: aioredis.Redis,
) -> None:
    """A batch none of whose lines was valid fails at create, which hands its webhook over: a
    broker that refused it made the create a 500 (no batch id; the client's retry made a second
    batch), and the event was lost, as such a batch never joined the active index."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = f"batch_{uuid.uuid4().hex}"
    fields = {"tenant": "default", "total": 1, "webhook": "https://hooks.example.com/b"}
    await store.create(batch_id, fields, TTL_S)
    await store.start(batch_id, [], 0, {"invalid": 1}, now_ms() + TTL_S * 1000)
    creating = BatchApiProgress(jobs, store, _Broker(refuses=True))
    failed = await creating.refresh(batch_id, window=0)
    assert failed is not None and failed.fields["status"] == BatchStatus.FAILED
    assert not await creating.notify(batch_id, failed)  # as create does
    broker = _Broker(refuses=False)
    await store.set_fields(batch_id, {"failed_at": now_ms() - COMPLETE_AFTER_MS})
    await BatchApiSweeper(store, BatchApiProgress(jobs, store, broker)).sweep()
    assert broker.sent == [("batch", batch_id, "batch.failed", f"evt_{batch_id}_failed")]
    assert await store.active() == []


async def test_a_cancel_whose_producer_died_before_settling_is_completed_by_the_sweeper(
    aredis: aioredis.Redis,
) -> None:
    """The end was recorded, then the producer died (or Redis failed it) before the items were
    settled: nothing settled them again, and the cancelled batch's items ran on until its
    window ran out."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    _, in_force = await store.request_end(batch_id, BatchStatus.CANCELLED)
    assert in_force == BatchStatus.CANCELLED  # and then the producer died
    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    assert (await store.read(batch_id) or {})["status"] == BatchStatus.CANCELLED
    ids = await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)
    records = await jobs.get_many([job_id.decode() for job_id in ids])
    assert [r.status if r else None for r in records] == [JobStatus.CANCELLED] * ITEMS
    assert await store.active() == []


async def _create_through(
    redis_url: str, aredis: aioredis.Redis, keys: Keys, fault: Callable[[ProducerState], None]
) -> tuple[httpx.Response, list[bytes]]:
    """POST a batch of ITEMS lines to a producer run in-process on a real Valkey, `fault` set on
    its state first; returns the answer and the statuses of the items it enqueued (in their own
    keys: no worker of another test reads their lane)."""
    settings = Settings(redis_url=redis_url, key_prefix=keys.prefix, auth="disabled")
    app = create_app(settings)
    source = "".join(
        json.dumps({"custom_id": f"c{n}", "body": {"model": "identity", "inputs": {"n": n}}}) + "\n"
        for n in range(ITEMS)
    )
    async with app.router.lifespan_context(app):
        fault(app.state.conveyor)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            response = await client.post(
                "/v1/batches",
                params={"model": "identity"},
                content=source,
                headers={"Content-Type": "application/jsonl"},
            )
    # enqueued before the failure (their hashes: a cancel withdraws a queued job's entry)
    items = [key async for key in aredis.scan_iter(f"{keys.job_prefix}*")]
    assert len(items) == ITEMS
    return response, [await aredis.hget(key, "status") for key in items]


async def _torn(*args: Any, **kwargs: Any) -> None:
    raise RedisConnectionError("the connection was torn")


async def test_a_create_that_fails_after_its_items_were_enqueued_withdraws_them(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis fails between enqueueing a batch's items and recording them (a torn connection):
    the client gets a 503 and no batch id, and its retry enqueues every item again. The items
    of the failed create ran all the same, for a batch nobody could read; now they are
    cancelled before any worker takes them."""

    def fault(state: ProducerState) -> None:
        monkeypatch.setattr(state.batch_store, "add_items", _torn)

    response, statuses = await _create_through(redis_url, aredis, Keys("withdraws:"), fault)
    assert response.status_code == 503, response.text
    assert statuses == [b"cancelled"] * ITEMS


async def test_a_create_whose_look_after_the_start_fails_ends_its_batch_cancelled(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis fails at the look that follows the batch's start: the create answered 503 (no
    batch id) while the batch ran, and OpenAI's SDK, which retries a 503, ran every line twice.
    Now its items are withdrawn and the batch ends cancelled; left running, the sweeper would
    have ended it `completed` (batch.completed), every item cancelled."""
    keys = Keys("unlooked:")
    looked: list[str] = []

    def fault(state: ProducerState) -> None:
        refresh = state.batch_progress.refresh

        async def torn_once(batch_id: str, window: int) -> Refresh | None:
            if window and not looked:  # the create's look; the sweeper's have no window
                looked.append(batch_id)
                await _torn()
            return await refresh(batch_id, window)

        monkeypatch.setattr(state.batch_progress, "refresh", torn_once)

    response, statuses = await _create_through(redis_url, aredis, keys, fault)
    assert response.status_code == 503, response.text
    assert statuses == [b"cancelled"] * ITEMS
    (batch_id,) = looked
    assert await aredis.hget(keys.batch(batch_id), "status") == b"cancelled"
    assert await aredis.zscore(keys.batches_active, batch_id) is None


async def test_a_create_its_replicas_did_not_confirm_answers_503_and_withdraws_its_items(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `CONVEYOR_REPLICA_ACKS` and no replica to confirm anything, `/v1/jobs` answers 503
    and `/v1/batches` answered 202: its items, their lists and its hash were written with no
    WAIT behind them, so a failover right after could lose what the 202 promised, and the batch
    never completed. Now its create answers 503 too and withdraws its items; the batch never
    started (nobody reads it; its hash expires with its TTL)."""
    monkeypatch.setenv("CONVEYOR_REPLICA_ACKS", "1")
    monkeypatch.setenv("CONVEYOR_REDIS_TIMEOUT_S", "0.5")
    get_settings.cache_clear()
    keys = Keys("unconfirmed:")
    try:
        response, statuses = await _create_through(redis_url, aredis, keys, lambda _: None)
    finally:
        get_settings.cache_clear()
    assert response.status_code == 503, response.text
    assert statuses == [b"cancelled"] * ITEMS
    (batch_key,) = await aredis.keys(keys.batch("*"))
    batch_id = batch_key.decode().split("{")[1].rstrip("}")
    assert await aredis.hget(keys.batch(batch_id), "status") == b"validating"
    assert await aredis.zscore(keys.batches_active, batch_id) is None


async def test_a_batchs_writes_wait_for_their_replicas(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write of a create that its 202 rests on (the items, their lists, the batch's start)
    is followed by a WAIT on its own connection: with no replica to confirm it, each raises."""
    monkeypatch.setenv("CONVEYOR_REPLICA_ACKS", "1")
    monkeypatch.setenv("CONVEYOR_REDIS_TIMEOUT_S", "0.2")
    get_settings.cache_clear()
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = f"batch_{uuid.uuid4().hex}"
    open_list = KEYS.batch_open(batch_id, "identity", "default")
    entry = RequestEntry(new_job_id("identity", "default"), {"inputs": {}}, now_ms())
    job = NewJob(entry, KEYS.bulk_queue("identity", "default"), {"batch": batch_id})
    try:
        await store.create(batch_id, {"tenant": "default", "total": 1}, TTL_S)
        with pytest.raises(ReplicaAckTimeout):
            await jobs.create_many([job])
        with pytest.raises(ReplicaAckTimeout):
            await store.add_items(batch_id, [(entry.job_id, open_list)], [], TTL_S)
        with pytest.raises(ReplicaAckTimeout):
            await store.start(batch_id, [open_list], 1, {"invalid": 0}, now_ms() + 60_000)
    finally:
        get_settings.cache_clear()


async def test_a_batch_whose_items_all_succeeded_by_its_window_s_end_completes(
    aredis: aioredis.Redis,
) -> None:
    """A batch ends when something counts it: one whose last item succeeded just before its
    window ran out, with nobody looking, was met by the sweeper past due and expired first,
    every item having succeeded (batch.expired; `conveyor batch submit --wait` exited 1)."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    ids = [job_id.decode() for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]
    for job_id in ids:
        await aredis.hset(KEYS.job(job_id), "status", JobStatus.SUCCEEDED.value)
    await aredis.zadd(KEYS.batches_active, {batch_id: now_ms() - 1})

    await BatchApiSweeper(store, BatchApiProgress(jobs, store, WEBHOOKS)).sweep()
    fields = await store.read(batch_id) or {}
    assert fields["status"] == BatchStatus.COMPLETED, fields
    assert fields["n_succeeded"] == str(ITEMS) and fields["open"] == "0"


async def test_a_batch_whose_items_expired_past_its_window_ends_expired(
    aredis: aioredis.Redis,
) -> None:
    """Workers mark an item they read past the batch's expiry `expired` themselves: a look
    that then counted the last of them finalized the batch `completed` (batch.completed,
    `conveyor batch submit --wait` exited 0), the sweeper never having met it running."""
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    batch_id = await _running_batch(store, jobs)
    window_end = now_ms() - 1
    await store.set_fields(batch_id, {"expires_at": window_end})
    ids = [job_id.decode() for job_id in await aredis.lrange(KEYS.batch_items(batch_id), 0, -1)]
    for job_id in ids:  # an item's deadline is its batch's expiry, as the Batch API enqueues it
        expired = {"status": JobStatus.EXPIRED.value, "deadline": window_end}
        await aredis.hset(KEYS.job(job_id), mapping=expired)

    progress = await BatchApiProgress(jobs, store, WEBHOOKS).refresh(batch_id, window=0)
    assert progress is not None and progress.fields["status"] == BatchStatus.EXPIRED
    assert progress.fields["n_expired"] == str(ITEMS)
    assert await store.active() == []
