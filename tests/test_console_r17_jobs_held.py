"""The console's Jobs list of a fair lane's held jobs once its `queue.fair` flag was switched
off in config.yaml, in-process on a real Valkey: the jobs still wait in their tenant's held
list until refilled, yet the list read held lists of fair lanes only, so they were listed
nowhere while they waited."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_console_links import FAIR_MODEL, submit_two_one_held

KEYS = Keys("console-r17-held:")


async def test_a_job_held_by_a_lane_no_longer_fair_is_listed(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path
) -> None:
    (tmp_path / "fair").mkdir()
    config = tmp_path / "fair" / "config.yaml"
    config.write_text(FAIR_MODEL)
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", model_repository=str(tmp_path)
    )
    async with app_client(create_app(settings)) as client:
        ids = await submit_two_one_held(client)
    assert await aredis.hget(KEYS.job(ids[1]), "held")
    config.write_text(FAIR_MODEL.replace("fair: true", "fair: false"))
    async with app_client(create_app(settings)) as client:
        listed = await client.get("/console/jobs")
    assert listed.status_code == 200, listed.text
    assert ids[0] in listed.text
    assert ids[1] in listed.text
