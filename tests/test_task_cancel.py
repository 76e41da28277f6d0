"""Stopping a background loop for sure, though Python 3.11's `asyncio.wait_for` (around every
redis-py socket write) can swallow a cancel that lands as the write completes."""

from __future__ import annotations

import asyncio

from producer_api.task_cancel import cancel_and_wait, first_done


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
