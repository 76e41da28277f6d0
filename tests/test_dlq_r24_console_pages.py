"""The console's dead-letter page past a partition's oldest 200 letters, in-process on a real
Valkey: the page showed those 200 and no way to the rest (the CLI pages). It links the next 200,
`?partition=<name>&after=<the last shown>`, until the last page; a malformed `after` is a 422."""

from __future__ import annotations

import re

import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.console.api_router import LETTERS_SHOWN
from shared.codec import RequestEntry, as_text
from shared.job_store import now_ms
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("dlq-r24-pages:")
MODEL, VARIANT = "identity", "default"
NEXT = re.compile(r'rel="next" href="/console/dead-letters\?partition=([^&]+)&amp;after=([^"]+)"')


async def _letters(client: aioredis.Redis, count: int) -> list[str]:
    """`count` dead letters of identity:default in one round trip; their DLQ ids."""
    pipe = client.pipeline(transaction=False)
    for _ in range(count):
        entry = RequestEntry(new_job_id(MODEL, VARIANT), {"inputs": {}}, now_ms(), tenant="t")
        fields: dict[str, str | int] = {"reason": "crashed", "deliveries": 3, **entry.encode()}
        pipe.xadd(KEYS.dlq(MODEL, VARIANT), fields)  # type: ignore[arg-type]
    return [as_text(dlq_id) for dlq_id in await pipe.execute()]


async def test_the_page_links_each_next_page_of_a_partitions_letters(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async for key in aredis.scan_iter(match=f"{KEYS.prefix}*"):
        await aredis.delete(key)
    ids = await _letters(aredis, LETTERS_SHOWN * 2 + 5)
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    seen: list[str] = []
    async with app_client(create_app(settings)) as client:
        url, pages = "/console/dead-letters", 0
        while url:
            page = await client.get(url)
            assert page.status_code == 200, page.text
            section = page.text.split(f"<h2>{MODEL}:{VARIANT} ")[1].split("</section>")[0]
            seen += re.findall(r'<td class="mono">([0-9]+-[0-9]+)</td>', section)
            found = NEXT.search(section)
            url = f"/console/dead-letters?partition={found[1]}&after={found[2]}" if found else ""
            pages += 1
        refused = await client.get("/console/dead-letters?partition=identity%3Adefault&after=x")
    assert seen == ids and pages == 3
    assert refused.status_code == 422, refused.text
