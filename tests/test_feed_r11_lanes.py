"""The feeding of Batch API held items, lane by lane, on a real Valkey: one lane whose key Redis
refuses (WRONGTYPE here; in a cluster, a slot whose master is down) is left for the next sweep
while the other lanes are fed (one pipeline for every lane failed them all, every sweep), and a
lane's room goes to the batches that still hold items (split evenly, a batch holding fewer
items than its share left the rest of the room unused until the next sweep). No app, no
worker: held items are written as the Batch API's create writes them."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from producer_api.batch_api.feeding import BatchFeeder
from shared.batch_api_store import BatchApiStore, HeldLane
from shared.codec import RequestEntry
from shared.job_store import JobStore, NewJob, now_ms
from shared.keys import Keys, new_job_id

KEYS = Keys("feed-r11-lanes:")
TTL_S = 600
LIMIT = 4


async def _held(store: BatchApiStore, model: str, held: int) -> HeldLane:
    """A new batch's lane of `model` holding `held` items its bulk lane had no room for."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    lane = HeldLane(
        KEYS.batch_held(batch_id, model, "default"),
        KEYS.batch_open(batch_id, model, "default"),
        KEYS.bulk_queue(model, "default"),
        LIMIT,
        model,
        "default",
        0,
        1.0,
        TTL_S,
    )
    fields = {"model": model, "variant": "default", "batch": batch_id}
    entries = [
        lane.entry(
            NewJob(RequestEntry(new_job_id(model, "default"), {}, now_ms()), lane.stream, fields)
        )
        for _ in range(held)
    ]
    await store.add_items(batch_id, [], [], TTL_S, [(lane.held, entries)])
    return lane


def _feeder(client: aioredis.Redis) -> tuple[BatchFeeder, BatchApiStore]:
    store = BatchApiStore(client, KEYS, TTL_S)
    return BatchFeeder(JobStore(client, KEYS, TTL_S), store), store


@pytest.mark.parametrize("refused", ["held", "stream"])
async def test_a_lane_redis_refuses_is_skipped_and_the_others_are_fed(
    aredis: aioredis.Redis, refused: str
) -> None:
    feeder, store = _feeder(aredis)
    broken, sound = await _held(store, "broken", 2), await _held(store, "sound", 2)
    await aredis.set(getattr(broken, refused), "not a list, nor a stream")

    await feeder.feed([broken, sound])  # raised WRONGTYPE: no lane was fed

    assert await aredis.xlen(sound.stream) == 2
    assert await aredis.llen(sound.held) == 0 and await aredis.llen(sound.items) == 2


async def test_every_lane_refused_is_raised_as_before(aredis: aioredis.Redis) -> None:
    """Nothing fed at all is the periodic loop's to log and back off from."""
    feeder, store = _feeder(aredis)
    lanes = [await _held(store, "broken", 1), await _held(store, "worse", 1)]
    for lane in lanes:
        await aredis.set(lane.held, "not a list")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await feeder.feed(lanes)


async def test_a_redis_that_does_not_answer_is_raised(aredis: aioredis.Redis) -> None:
    lane = await _held(BatchApiStore(aredis, KEYS, TTL_S), "sound", 1)
    gone = aioredis.Redis(port=1, retry=Retry(NoBackoff(), 0))  # nothing listens on port 1
    try:
        with pytest.raises(RedisConnectionError):
            await _feeder(gone)[0].feed([lane])
    finally:
        await gone.aclose()


async def test_a_lanes_room_goes_to_the_batches_that_still_hold_items(
    aredis: aioredis.Redis,
) -> None:
    """Room 4 between a batch holding 1 item and one holding 6: 1 and 3, not 1 and 2."""
    feeder, store = _feeder(aredis)
    small, big = await _held(store, "shared", 1), await _held(store, "shared", 6)
    await feeder.feed([small, big])
    assert await aredis.xlen(big.stream) == LIMIT
    assert await aredis.llen(small.held) == 0 and await aredis.llen(big.held) == 3
