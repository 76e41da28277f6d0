"""A stop that cuts a micro-batch's top-up read after Redis handed that read entries: the reply
is lost with the cut, and what it handed over must join the micro-batch (claimed back), not sit
in this consumer's pending list until another worker's reclaim, a visibility timeout and one
delivery later. On a real Valkey, through a proxy that loses the read's reply."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import redis.asyncio as aioredis

from shared.job_store import JobStore
from shared.keys import GROUP, Keys
from shared.redis_client import connect
from tests.conftest import until_async
from tests.lane_rig import abandoned_after, queue_jobs
from tests.reply_dropper import ReplyDropper
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.stopping import Stopping
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r39cut:")
PARTITION = abandoned_after(KEYS, 60)
WORKER = "box-39-cut"
LONG_MS = 600_000  # a delay and a block no test waits out: only the stop ends them


class StopOnAnswer(ReplyDropper):
    """A ReplyDropper that sets the loop's stop (`cut`) the moment the server has answered the
    request whose reply it drops: the stop cuts that read, its entries handed over, unseen."""

    def __init__(self, host: str, port: int, marker: bytes, stop: Stopping) -> None:
        self.cut = stop
        super().__init__(host, port, marker)

    async def sent(self) -> bool:
        """Whether the read whose reply it drops went to the server."""
        return self.dropped > 0

    @property
    def answer(self) -> bytes:
        return self._answer

    @answer.setter
    def answer(self, value: bytes) -> None:
        self._answer = value
        if value:
            self.cut.set()


async def test_a_stop_cutting_a_top_up_that_was_handed_entries_claims_them_back(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    """The blocking read hands `first` over and the micro-batch is held open (jobs arriving);
    its top-up read is handed `second`, and the stop cuts it before the reply arrives. The
    micro-batch returned holds both, and nothing else stays pending to this consumer."""
    store = JobStore(aredis, KEYS, ttl_s=60)
    await StreamReader(aredis, KEYS, PARTITION.streams, WORKER).ensure_groups()
    await queue_jobs(store, PARTITION.online, "first")
    stop = Stopping()
    url = urlparse(redis_url)
    top_up_read = f"{PARTITION.online}\r\n$1\r\n>".encode()  # one lane's: not the blocking read
    proxy = StopOnAnswer(url.hostname or "127.0.0.1", url.port or 6379, top_up_read, stop)
    patient = connect(await proxy.start(), blocks_ms=LONG_MS)  # its socket outlasts the block
    reader = StreamReader(patient, KEYS, PARTITION.streams, WORKER)
    reader.max_block_ms = LONG_MS
    events = JobEvents("redis://unused")
    lanes = LaneScheduler(
        PARTITION, reader, Reclaimer(patient, KEYS, PARTITION, WORKER, 60, events)
    )
    lanes.arrivals[PARTITION.online].arrived(10_000)  # busy: the micro-batch is held open
    reading = asyncio.create_task(lanes.next_batch(10, LONG_MS, LONG_MS, stop=stop))
    try:
        await until_async(proxy.sent, every=0.01)
        await queue_jobs(store, PARTITION.online, "second")  # handed to the top-up read
        ((stream, deliveries),) = await asyncio.wait_for(reading, 30)  # a bound, not a timing
    finally:
        await patient.aclose()
        await proxy.stop()

    assert proxy.dropped == 1 and b"second" in proxy.answer  # the cut read was handed it
    assert stream == PARTITION.online
    assert [d.entry.job_id for d in deliveries if d.entry] == ["first", "second"]
    pending = await aredis.xpending_range(PARTITION.online, GROUP, "-", "+", 10, WORKER)
    assert {row["message_id"] for row in pending} == {d.entry_id for d in deliveries}
    # claimed back, the cut read's entry counts the one delivery it had: the read ran nothing
    assert [row["times_delivered"] for row in pending] == [1, 1]
    assert [d.attempts for d in deliveries] == [1, 1]
