"""While the broker refuses, a canary's owed webhooks wait out a back-off: every look (0.5 s)
asked the broker again for each, a refused publish holding the look (0.6 s against a server
that is down). Once the broker takes writes again they are handed over, in the order decided.
The broker is a Valkey of its own that refuses writes (maxmemory: server-wide), the canary's
state on the session's real Valkey."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests.conftest import own_valkey, until_async
from tests.test_canary_r25_owed_webhooks import _deliveries, _producer
from tests.test_webhook_owed_edges_canary import MODEL, _canary

LOOKS = 3


@pytest.fixture(scope="module")
def broker_url() -> Iterator[str]:
    with own_valkey() as url:
        yield url


@pytest.fixture
async def broker(broker_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(broker_url)
    await client.config_set("maxmemory-policy", "noeviction")
    await client.config_set("maxmemory", 1)
    yield client
    await client.config_set("maxmemory", 0)
    await client.aclose()


async def _refused(broker: aioredis.Redis) -> int:
    """How many commands the broker has refused: kombu's to publish."""
    stats = await broker.info("commandstats")
    return sum(command["rejected_calls"] for command in stats.values())


async def test_owed_webhooks_back_off_while_the_broker_refuses(
    aredis: aioredis.Redis, broker: aioredis.Redis, broker_url: str
) -> None:
    leader = await _producer(aredis, broker_url)
    assert await leader.start(_canary())  # the start stands, its webhook refused
    per_try = await _refused(broker)  # the commands of one publish kombu tried
    assert per_try
    for _ in range(LOOKS):  # each owes the `started` webhook, and from the first a `step` too
        await leader.look()
    # Each look tried again (5 publishes in all); now the start's alone, or one more should the
    # machine stall past the first back-off (0.1 s) between two looks.
    assert await _refused(broker) <= 2 * per_try, (await _refused(broker), per_try)
    assert await _deliveries(broker) == []

    await broker.config_set("maxmemory", 0)

    async def handed_over() -> list[str]:
        await leader.look()
        return [delivery["type"] for delivery in await _deliveries(broker)]

    assert await until_async(handed_over) == ["model.canary.started", "model.canary.step"]
    _, owed = await leader.store.owing(MODEL)
    assert owed == []
