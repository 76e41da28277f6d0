"""Requests to paths of tens of kB (uvicorn takes up to 64 kB), sent without any API key, leave
nothing behind: the boundary kept the route answer of each path it saw, up to 4096 of them
whole, some 270 MB a producer held for anyone who sent them."""

from __future__ import annotations

import gc
import tracemalloc
import urllib.parse

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client

PATH_CHARS = 60_000  # under httpx's (and uvicorn's) 64 kB limit on a URL
REQUESTS = 100
# what the requests may leave behind, far below one path's size times their number (6 MB)
RETAINED_MAX = 1_000_000


async def test_long_paths_are_not_kept(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, instance_id="r34-paths")
    async with app_client(create_app(settings)) as client:
        await client.get(f"/v1/jobs/{'f' * PATH_CHARS}")  # the app's first request classes routes
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for n in range(REQUESTS):
                answer = await client.get(f"/v1/jobs/{n:04d}{'e' * PATH_CHARS}")
                assert answer.status_code == 401, answer.text  # no key: refused
            urllib.parse.clear_cache()  # the test client's: httpx parses each URL for cookies
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert after - before < RETAINED_MAX
