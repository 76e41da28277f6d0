"""A stop's claim-back (`StreamReader.held`) after a micro-batch's top-up: only a top-up read
the stop cut can have lost a reply that handed entries over, so only then is this consumer's
pending list listed (XPENDING) and its lost entries claimed back. On a real Valkey."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from tests.lane_rig import abandoned_after, queue_jobs
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import LaneEntry, StreamReader

KEYS = Keys("r40stop:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-40-stop"
LONG_MS = 600_000  # a delay and a block no test waits out


async def _xpending_calls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_xpending", {}).get("calls", 0))


async def test_a_stop_before_the_top_up_reads_lists_no_pending_entries(
    aredis: aioredis.Redis,
) -> None:
    """The stop lands while the TAKE that read a micro-batch is under way: the top-up
    then sends no read, so no reply of one was lost, and no XPENDING follows (one was sent at
    every such stop, a round trip that could find nothing the stop had cut)."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    await queue_jobs(store, PARTITION.online, "first")
    lanes = LaneScheduler(
        PARTITION, reader, Reclaimer(aredis, KEYS, PARTITION, WORKER, 60, JobEvents("redis://x"))
    )
    lanes.new_turn = True  # after a reclaimed entry: what waits new is a TAKE (no reclaim pass)
    lanes.arrivals[PARTITION.online].arrived(10_000)  # busy: the micro-batch would be held open
    stop = Stopping()
    stop.set()
    before = await _xpending_calls(aredis)

    ((stream, deliveries),) = await lanes.next_batch(10, LONG_MS, LONG_MS, stop=stop)

    assert stream == PARTITION.online
    assert [d.entry.job_id for d in deliveries if d.entry] == ["first"]
    assert await _xpending_calls(aredis) == before


async def test_a_claim_back_finds_the_lost_entries_behind_more_running_ones_than_it_claims(
    aredis: aioredis.Redis,
) -> None:
    """The pending list is listed oldest first, and what runs (`in_hand`) is older than what a
    cut read lost: the page is as long again as the running entries, so six running ahead of
    the two lost hide neither (a page of two listed only running ones: the lost waited for
    another worker's reclaim, a visibility timeout and a delivery more)."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    reader = StreamReader(aredis, KEYS, PARTITION.streams, WORKER)
    await reader.ensure_groups()
    running = [f"running-{n}" for n in range(6)]
    await queue_jobs(store, PARTITION.online, *running, "lost-1", "lost-2")
    reply: Any = await aredis.xreadgroup(GROUP, WORKER, {PARTITION.online: ">"})
    [(_, read)] = reply
    in_hand: set[LaneEntry] = {(PARTITION.online, entry_id) for entry_id, _ in read[: len(running)]}

    ((stream, lost),) = await reader.held([PARTITION.online], 2, in_hand)

    assert stream == PARTITION.online
    assert [d.entry.job_id for d in lost if d.entry] == ["lost-1", "lost-2"]
