"""A resume's Last-Event-ID against the token hub's one shared read per stream, on a real
Valkey: the first listener's id set where that read started, so an id from the far future (the
client's to choose) left every later listener of the same job without a live token until the
job ended."""

from __future__ import annotations

import asyncio

from producer_api.token_hub import TagReader
from shared.redis_client import connect

FAR_FUTURE = "99999999999999-0"


async def test_a_far_future_resume_does_not_hold_back_the_jobs_other_listeners(
    redis_url: str,
) -> None:
    client = connect(redis_url, blocks_ms=0)
    hub = TagReader(redis_url, client, "resume-wake", "resume-test")
    key = "resume-tokens"
    await client.xadd(key, {"kind": "token", "text": "before", "tokens": 1})
    await hub.start()
    try:
        async with hub.listen(key, FAR_FUTURE) as bogus, hub.listen(key, "0-0") as honest:
            await client.xadd(key, {"kind": "token", "text": "live", "tokens": 1})
            for queue in (honest, bogus):  # the hub hands every listener the same rows
                rows = await asyncio.wait_for(queue.get(), 5)
                assert isinstance(rows, list) and rows[-1][1][b"text"] == b"live", rows
    finally:
        await hub.stop()
        await client.aclose()
