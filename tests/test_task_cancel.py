"""Stopping a background loop for sure, though Python 3.11's `asyncio.wait_for` (around every
redis-py socket write) can swallow a cancel that lands as the write completes."""

from __future__ import annotations

import asyncio

from producer_api.task_cancel import cancel_and_wait


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
