"""Webhook hosts no delivery can try, and a batch's end event on a re-send.

A host that is no DNS name matched a `*.` rule and was accepted (202): `evil.com\\.example.com`
(a resolver may read `\\.` as an escaped dot, outside the rule's suffix), `%` escapes, an `xn--`
label that is no IDNA (httpx refuses it at every attempt). Submit refuses them (422, naming the
webhook). And a Batch API batch's end event was stamped with the clock of each hand-over: the
sweeper's re-send, one event id, another creation time. A producer in process and the real
Celery broker queue, both on the session's Valkey."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.batch_api.progress import BatchApiProgress
from shared.batch_api_store import BatchApiStore, BatchStatus
from shared.job_store import JobStore, now_ms
from shared.settings import Settings
from shared.webhook_events import WebhookDispatcher, allowed
from tests.app_client import app_client
from tests.test_batch_api_r11_sweeps import KEYS, TTL_S, _running_batch

RULES = ["https://*.example.com", "http://10.0.0.5:8080", "http://[fd00::5]:8080"]
BROKER_QUEUE = "celery"  # Celery's default queue: a Redis list of kombu messages
ENDED_AGO_MS = 300_000  # the batch ended five minutes before the sweeper's re-send
NO_DNS_NAMES = [
    "evil.com\\.example.com",
    "evil.com%2f.example.com",
    "a%41.example.com",
    "xn--.example.com",  # no IDNA: httpx raised at every attempt
    "xn--zz.example.com",
    "-a.example.com",
    "a!.example.com",
]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(
        redis_url=redis_url,
        auth="disabled",
        instance_id="webhooks-r26",
        webhook_secret="s" * 32,
        webhook_allowlist=RULES,
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def test_a_host_that_is_no_dns_name_is_refused_at_submit(
    producer: httpx.AsyncClient,
) -> None:
    for host in NO_DNS_NAMES:
        url = f"https://{host}/hooks"
        refused = await producer.post(
            "/v1/batches", params={"model": "identity", "webhook": url}, content=b'{"x": 1}\n'
        )
        assert refused.status_code == 422, (host, refused.text)
        error = refused.json()["error"]
        assert error["type"] == "invalid_request", error
        assert error["message"].startswith(f"webhook URL {url!r} is not in"), error


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "https://HOOKS.Example.com/x",
        "https://xn--bcher-kva.example.com/x",  # IDNA, as sent for bücher
        "https://bücher.example.com/x",
        "http://10.0.0.5:8080/x",
        "http://[fd00::5]:8080/x",
        "https://hook_receiver.example.com/x",  # a Compose service's name has underscores
    ],
)
def test_dns_names_and_ip_literals_are_still_allowed(url: str) -> None:
    assert allowed(url, RULES)


async def _events(client: aioredis.Redis) -> list[dict[str, Any]]:
    """The events handed to delivery, oldest first: each kombu message's task kwargs."""
    messages = await client.lrange(BROKER_QUEUE, 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in reversed(messages)]
    return [kwargs["event"] for _, kwargs, _ in bodies]


async def test_a_resent_batch_event_is_created_when_the_batch_ended(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    store, jobs = BatchApiStore(aredis, KEYS, TTL_S), JobStore(aredis, KEYS, TTL_S)
    progress = BatchApiProgress(jobs, store, WebhookDispatcher(redis_url))
    batch_id = await _running_batch(aredis, now_ms() + 3_600_000)
    await aredis.hset(KEYS.batch(batch_id), "webhook", "https://hooks.example.com/b")
    assert await progress.end(batch_id, BatchStatus.CANCELLED) == BatchStatus.CANCELLED
    # it ended five minutes ago, and its webhook is owed again (what a broker that refused the
    # hand-over leaves): the sweeper's pass hands it over now
    ended_ms = now_ms() - ENDED_AGO_MS
    await aredis.hset(KEYS.batch(batch_id), "cancelled_at", ended_ms)
    await aredis.hdel(KEYS.batch(batch_id), "webhook_status")
    ended = await progress.refresh(batch_id, window=0)
    assert ended is not None
    await progress.complete(batch_id, ended)
    first, again = await _events(aredis)
    assert first["id"] == again["id"] == f"evt_{batch_id}_cancelled"
    for sent in (first, again):  # each send is created when the batch it reports ended
        assert sent["created"] == sent["data"]["cancelled_at"]
    assert again["created"] == ended_ms // 1000
