"""Stopping a background loop for sure, though Python 3.11's `asyncio.wait_for` (around every
redis-py socket write) can swallow a cancel that lands as the write completes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest

from producer_api.app import build_state
from producer_api.auth.principal import ANONYMOUS
from producer_api.errors import ConveyorError
from producer_api.events.serving import EventsService
from producer_api.stream_shutdown import until_shutdown
from producer_api.task_cancel import cancel_and_wait, first_done
from shared.keys import new_job_id
from shared.settings import Settings


async def test_a_loop_whose_cancel_wait_for_swallowed_is_still_stopped() -> None:
    loop = asyncio.get_running_loop()
    writes: list[asyncio.Future[None]] = []

    async def write_forever() -> None:
        while True:
            writes.append(loop.create_future())
            await asyncio.wait_for(writes[-1], 5)  # as redis-py sends a command

    task = asyncio.create_task(write_forever())
    await asyncio.sleep(0)  # the loop waits for its first write
    writes[-1].set_result(None)  # the write completes in the same loop step as the cancel
    async with asyncio.timeout(5):  # a cancel sent once would be lost here on Python 3.11
        await cancel_and_wait(task)
    assert task.cancelled()


async def test_work_that_lost_a_race_is_stopped_though_wait_for_swallowed_its_cancel() -> None:
    """A non-streamed answer races the producer's stop (`first_done`): its token follower waits
    in `wait_for` for each token, and a cancel that lands as a token arrives is swallowed. Sent
    once, the answer ran on to the end of its generation (20 s past the stop, seen in CI)."""
    loop = asyncio.get_running_loop()
    tokens: list[asyncio.Future[None]] = []

    async def follow_tokens() -> None:
        while True:
            tokens.append(loop.create_future())
            await asyncio.wait_for(tokens[-1], 60)  # the next token

    stopping = loop.create_future()
    race = asyncio.create_task(first_done(follow_tokens(), [stopping]))
    await asyncio.sleep(0)  # the race begins
    await asyncio.sleep(0)  # the work waits for its first token
    stopping.set_result(None)
    await asyncio.sleep(0)  # the race sees the stop and sends its cancel ...
    tokens[-1].set_result(None)  # ... as a token arrives in the same loop step
    await asyncio.wait({race}, timeout=5)  # it waited for the whole generation before
    assert race.done() and race.result().cancelled()


class Follower:
    """A token follower as `TokenFollower` waits: in `wait_for`, for each delivery of rows, and
    rows it has already sent are skipped. A cancel that lands as a delivery arrives is swallowed
    there (Python 3.11, gh-86296): it skips the rows and waits again."""

    def __init__(self) -> None:
        self.deliveries: list[asyncio.Future[int]] = []
        self.swallowed = False
        self.closed = False

    async def follow(self) -> AsyncIterator[int]:
        loop = asyncio.get_running_loop()
        sent = 0
        try:
            while True:
                self.deliveries.append(loop.create_future())
                row = await asyncio.wait_for(self.deliveries[-1], 60)
                self.swallowed |= bool((task := asyncio.current_task()) and task.cancelling())
                if row > sent:
                    sent = row
                    yield row
        finally:
            self.closed = True

    async def redeliver(self) -> None:
        """Rows already sent, every loop step, until a cancel was swallowed (so that the next one
        can land) or the follower is closed: whenever a cancel lands, a delivery arrives."""
        while not (self.swallowed or self.closed):
            if self.deliveries and not self.deliveries[-1].done():
                self.deliveries[-1].set_result(0)
            await asyncio.sleep(0)


async def test_a_stream_stops_at_shutdown_though_wait_for_swallowed_its_cancel() -> None:
    """At the producer's stop, a stream stops following its job; cancelled once, a follower
    that swallowed the cancel followed on, the stream stayed open, and uvicorn's shutdown
    waited on it."""
    follower = Follower()
    shutdown = anyio.Event()

    async def stream() -> list[int]:
        return [row async for row in until_shutdown(follower.follow(), shutdown)]

    streaming = asyncio.create_task(stream())
    await asyncio.sleep(0)  # the stream waits for its first delivery
    shutdown.set()
    redelivering = asyncio.create_task(follower.redeliver())
    await asyncio.wait({streaming}, timeout=5)  # it stayed open for good before
    assert streaming.done() and streaming.result() == [] and follower.closed
    await redelivering


async def test_a_stream_that_ends_early_stops_its_token_follower_though_it_swallowed_a_cancel(
    redis_url: str,
) -> None:
    """A job's event stream starts following its tokens while it reports the job's standing;
    when it ends first (here: the job is gone), the follower is stopped before the stream ends.
    Cancelled once and not waited for, one that swallowed the cancel followed on, unread."""
    state = build_state(Settings(redis_url=redis_url, auth="disabled"))
    follower = Follower()
    gone = new_job_id("identity", "default")
    events = EventsService(state, ANONYMOUS)._after_queue(gone, follower.follow())
    redelivering = asyncio.create_task(follower.redeliver())
    try:
        with pytest.raises(ConveyorError, match="not found"):
            async with asyncio.timeout(5):
                await anext(events)
    finally:
        await state.redis.aclose()
    assert follower.closed
    await redelivering
