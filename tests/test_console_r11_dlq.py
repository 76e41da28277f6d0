"""The console's dead-letter pages with a partition's dead-letter key of another type than a
stream (written by hand, or a prefix another application shares), in-process on a real Valkey:
each answered a 500 (Redis's WRONGTYPE), the page listing every partition's letters included.
They say what the key is, as `conveyor dlq` does, and the page still lists the others."""

from __future__ import annotations

import re

import httpx
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("console-r11-dlq:")
BROKEN = KEYS.dlq("identity", "default")
SAID = f"{BROKEN} is a string, not a stream"


def _settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")


async def test_the_dead_letters_page_names_a_key_of_another_type(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await aredis.set(BROKEN, "not a stream")
    async with app_client(create_app(_settings(redis_url))) as client:
        page = await client.get("/console/dead-letters")
    assert page.status_code == 200, page.text
    assert SAID in page.text
    assert "<h2>minilm:" in page.text  # the other partitions are listed still


async def test_a_replay_or_discard_of_a_key_of_another_type_says_what_it_is(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await aredis.set(BROKEN, "not a stream")
    async with app_client(create_app(_settings(redis_url))) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/console")).text)
        assert csrf is not None
        form = {"partition": "identity:default", "upto": "0-1", "csrf": csrf[1]}
        answers: list[httpx.Response] = [
            await client.get(
                "/console/dead-letters/confirm",
                params={"action": "discard", "partition": "identity:default"},
            ),
            await client.post("/console/dead-letters/discard", data=form),
            await client.post("/console/dead-letters/replay", data=form),
        ]
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["message"].startswith(SAID)
    assert await aredis.get(BROKEN) == b"not a stream"
