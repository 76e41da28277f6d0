"""One partition's stream key of another type (an operator's slip, which the producer's startup
already leaves out, naming it) refused the one pipelined read of every partition's queue state:
`/metrics` then exported no partition gauge at all, for any model, and said nothing, so lag,
DLQ and backlog alerts went blind for every healthy pool, and `GET /v1/models` answered 500. The
broken partition is left out, the others read still."""

from __future__ import annotations

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from producer_api.app import create_app
from producer_api.metrics import api_router
from shared.keys import Keys
from shared.metrics import BACKLOG_SECONDS, PARTITION_LAG
from shared.settings import Settings
from tests.app_client import app_client

PREFIX = "health-edges-gauges:"


def _samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sorted(sample.labels.values())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


async def test_a_partition_key_of_another_type_leaves_the_others_gauges_read(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(PREFIX)
    with redis.Redis.from_url(redis_url) as client:
        client.set(keys.queue("identity", "default"), "not a stream")
        for n in range(3):
            client.xadd(keys.queue("minilm", "default"), {"n": n})
    PARTITION_LAG.clear()  # what another test's scrape left in this process's gauges
    BACKLOG_SECONDS.clear()
    monkeypatch.setattr(api_router, "_last_refresh", 0.0)  # read now, whatever scraped before
    settings = Settings(redis_url=redis_url, key_prefix=PREFIX, auth="disabled")
    async with app_client(create_app(settings)) as client:
        text = (await client.get("/metrics")).text
        listed = await client.get("/v1/models")  # the same read: a 500 for every model
    assert listed.status_code == 200, listed.text
    cards = {card["id"]: card for card in listed.json()["data"]}
    assert [p["variant"] for p in cards["minilm"]["partitions"]] == ["default", "torch"]
    assert "default" not in [p["variant"] for p in cards["identity"]["partitions"]]
    lag = _samples(text, "conveyor_partition_lag")
    assert lag[("default", "minilm", "online")] == 3, lag
    assert ("default", "identity", "online") not in lag  # the broken one: nothing to say
    assert ("default", "minilm") in _samples(text, "conveyor_backlog_seconds")


async def test_a_key_a_script_finds_of_another_type_leaves_its_partition_out(
    redis_url: str,
) -> None:
    """A key of another type that a script reads (a lane's held-jobs `fair:since` set written as
    a string) is refused inside the script, its error prefixed with the script's line
    (`user_script:26: WRONGTYPE …`): not taken for the slip it is, `GET /v1/models` was a 500.
    The lane's state read by the commands stands; only its oldest job's age is unknown."""
    keys = Keys(PREFIX + "script:")
    lane = keys.queue("identity", "default")
    with redis.Redis.from_url(redis_url) as client:
        client.xadd(lane, {"enq": 1})
        client.set(f"{lane}:fair:since", "not a sorted set")
    settings = Settings(redis_url=redis_url, key_prefix=keys.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        listed = await client.get("/v1/models")
    assert listed.status_code == 200, listed.text
    cards = {card["id"]: card for card in listed.json()["data"]}
    identity = {p["variant"]: p for p in cards["identity"]["partitions"]}
    assert identity["default"]["lag"] == 1, identity
    assert [p["variant"] for p in cards["minilm"]["partitions"]] == ["default", "torch"]
