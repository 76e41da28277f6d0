"""A cancel that meets a batch whose every item had already finished, before any look counted
them, stopped nothing: the batch ended `cancelled` all the same, with every line in its output
file and none cancelled, and a client (`batch submit --wait` exits 1 for it) took the results
of a batch that had run to its end for a cancelled one. It ends `completed`, as a cancel a
moment later (one whose look counted them first) finds it, and the cancel is that one's 409,
naming the status the batch ended in (a 409 named the status the cancel's first look had read,
`in_progress`); one that stopped an item ends `cancelled`. Stack-free: a real Valkey, the
items' results written as a worker writes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis
from redis.typing import EncodableT

from producer_api.app import create_app
from producer_api.batch_api.progress import BatchApiProgress
from shared.batch_api_store import BatchApiStore, BatchStatus, final_counts
from shared.codec import as_text
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_batch_sweeps import ITEMS, KEYS, TTL_S, WEBHOOKS, _running_batch


async def _succeed(redis: aioredis.Redis, job_ids: Sequence[str]) -> None:
    """The items' results, written as a worker writes them."""
    ended: dict[EncodableT, EncodableT] = {
        "status": JobStatus.SUCCEEDED.value, "finished": now_ms(), "outputs": "{}",
    }  # fmt: skip
    for job_id in job_ids:
        await redis.hset(KEYS.job(job_id), mapping=ended)


async def _finished(redis: aioredis.Redis, batch_id: str, count: int) -> None:
    """The batch's first `count` items succeeded, none counted yet."""
    ids = await redis.lrange(KEYS.batch_items(batch_id), 0, count - 1)
    await _succeed(redis, [as_text(job_id) for job_id in ids])


async def test_a_cancel_that_stopped_no_item_leaves_the_batch_completed(
    aredis: aioredis.Redis,
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    progress = BatchApiProgress(jobs, store, WEBHOOKS)
    done, cut = await _running_batch(store, jobs), await _running_batch(store, jobs)
    await _finished(aredis, done, ITEMS)
    await _finished(aredis, cut, ITEMS - 1)

    for batch_id in (done, cut):
        assert await progress.end(batch_id, BatchStatus.CANCELLED) == BatchStatus.CANCELLED
    fields = await store.read(done) or {}
    assert fields["status"] == BatchStatus.COMPLETED, fields
    assert "completed_at" in fields and "cancelled_at" not in fields
    assert final_counts(fields) == {"succeeded": ITEMS, "failed": 0, "cancelled": 0, "expired": 0}
    fields = await store.read(cut) or {}
    assert fields["status"] == BatchStatus.CANCELLED, fields
    assert final_counts(fields)["cancelled"] == 1


class _FinishedFirst(JobStore):
    """The cancelling producer's job store: the worker writes the last results just before the
    cancel settles the items, after the cancel's look counted none of them."""

    async def settle_many(
        self, job_ids: Sequence[str], target: JobStatus, fields: Mapping[str, str | int]
    ) -> int:
        await _succeed(self.redis, job_ids)
        return await super().settle_many(job_ids, target, fields)


class _EndedFirst(BatchApiStore):
    """The cancelling producer's batch store: between the cancel's look and its request to end,
    the last results come and another caller (the sweeper) counts them, ending the batch."""

    async def request_end(
        self, batch_id: str, ending: BatchStatus
    ) -> tuple[str | None, BatchStatus | None]:
        await _finished(self.redis, batch_id, 3)
        sweeper = BatchApiProgress(JobStore(self.redis, KEYS, TTL_S), self, WEBHOOKS)
        await sweeper.refresh(batch_id, window=0)
        # the app's own sweeper may be finalizing it meanwhile (then this refresh left it to
        # that one): the cancel is to meet its end, not its finalization
        await until_async(lambda: self._ended(batch_id))
        return await super().request_end(batch_id, ending)

    async def _ended(self, batch_id: str) -> bool:
        fields = await self.read(batch_id) or {}
        return "status" in fields and BatchStatus(fields["status"]).terminal


async def _refused_cancel(redis_url: str, aredis: aioredis.Redis, ends: str) -> None:
    """A cancel that met the end of a batch of 3 items (`ends` it first) is refused as one of an
    ended batch: 409, naming the status it ended in."""
    app = create_app(Settings(redis_url=redis_url, auth="disabled", instance_id="r8-cancel"))
    async with app_client(app) as client:
        progress = app.state.conveyor.batch_progress
        if ends == "settle":
            progress.jobs = _FinishedFirst(aredis, KEYS, TTL_S)
        else:
            progress.store = _EndedFirst(aredis, KEYS, TTL_S)
        lines = b"".join(b'{"custom_id": "%d", "body": {"inputs": {}}}\n' % i for i in range(3))
        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=lines,
            headers={"Content-Type": "application/jsonl"},
        )
        batch_id = created.json()["id"]
        refused = await client.post(f"/v1/batches/{batch_id}/cancel")
        assert refused.status_code == 409, refused.text
        assert f"{batch_id} is completed;" in refused.json()["error"]["message"], refused.text
        batch = (await client.get(f"/v1/batches/{batch_id}")).json()
        assert (batch["status"], batch["request_counts"]["completed"]) == ("completed", 3)


async def test_a_cancel_whose_settling_met_the_last_results_is_refused(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """It answered 200 for a batch whose items it had not cancelled, every one succeeded."""
    await _refused_cancel(redis_url, aredis, "settle")


async def test_a_cancel_that_came_as_the_batch_ended_names_its_end(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Its 409 named the status its first look read: `is in_progress; cannot cancel`."""
    await _refused_cancel(redis_url, aredis, "request")
