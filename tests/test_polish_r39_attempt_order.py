"""`conveyor jobs get --attempts` prints each attempt's fields in the API's order (README:
consumer, host, pid, started, ended, outcome, error): the SDK's model put `outcome` first, so
the CLI's JSON read otherwise than the API's answer. A producer served by uvicorn here over a
real Valkey; the job's attempts written by the workers' own reader and reclaimer."""

from __future__ import annotations

import json

import httpx
import redis.asyncio as aioredis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.stack import free_port
from producer_api.app import create_app
from shared.settings import Settings
from tests.local_http import served_app
from tests.test_attempts import KEYS, _taken_over

JOB_ID = "a1" * 16  # shaped as the API's ids
ORDER = ["consumer", "host", "pid", "started", "ended", "outcome", "error"]


async def test_jobs_get_attempts_prints_the_apis_field_order(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    await aredis.flushdb()
    await _taken_over(aredis, JOB_ID)  # hA-1 crashed (its error), hB-2 runs it
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    with served_app(create_app(settings), free_port()) as url:
        api = await _api_attempts(url)
        printed = CliRunner().invoke(main, ["jobs", "get", JOB_ID, "--attempts", "--url", url])
    assert printed.exit_code == 0, printed.output
    runs = json.loads(printed.stdout)["attempt_history"]
    assert [list(run) for run in runs] == [list(run) for run in api]
    assert list(runs[0]) == ORDER, runs


async def _api_attempts(url: str) -> list[dict[str, object]]:
    """The attempts as the HTTP API answers them, in its own key order."""
    async with httpx.AsyncClient(base_url=url) as client:
        answer = await client.get(f"/v1/jobs/{JOB_ID}", params={"attempts": "true"})
    answer.raise_for_status()
    runs: list[dict[str, object]] = answer.json()["attempt_history"]
    return runs
