"""CONVEYOR_PUBLIC_URL: the base of every link the producer hands out (a job's 202 `urls` and
`Location`, a batch's `urls` and `Location` on create, get, list and cancel, and its webhook
event's `urls`). Unset, links follow the request's Host as before, and the webhook event's stay
relative; set, a Host of the client's choosing (or a proxy's internal name) never reaches a
link, and the webhook event's links are absolute like `GET /v1/batches/{id}`'s. A producer
served in-process over the session's Valkey and the real Celery broker queue, no worker."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from producer_api.app import create_app
from shared.settings import Settings, bad_setting, settings_or_exit
from tests.app_client import app_client
from tests.test_webhooks_r26_hosts_and_batch_events import _events

LINE = b'{"custom_id": "a", "body": {"model": "identity", "inputs": {"x": 1}}}\n'
JSONL = {"content-type": "application/jsonl"}
JOB = {"model": "identity", "inputs": {"x": 1}}
HOOK = "https://hooks.example.com/batches"
OTHER_HOST = {"host": "internal.example:8080"}  # what a client or a proxy may send


def _settings(redis_url: str, public_url: str) -> Settings:
    """A producer taking any Host (as one with auth on does) and webhooks to `HOOK`."""
    return Settings(
        redis_url=redis_url,
        auth="disabled",
        allowed_hosts=["*"],
        instance_id="public-url-r37",
        webhook_secret="s" * 32,
        webhook_allowlist=["https://hooks.example.com"],
        public_url=public_url,
    )


async def _batch_event(aredis: aioredis.Redis, batch_id: str) -> dict[str, Any]:
    """The data of the batch's end event as handed to delivery."""
    (data,) = [e["data"] for e in await _events(aredis) if e["data"].get("id") == batch_id]
    return data


async def _links(client: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
    """Every link one job and one batch get, each asked with another Host, and the id of the
    batch (cancelled, so its webhook event is handed over)."""
    job = await client.post("/v1/jobs", json=JOB, headers=OTHER_HOST)
    created = await client.post(
        "/v1/batches", params={"webhook": HOOK}, content=LINE, headers=JSONL | OTHER_HOST
    )
    assert (job.status_code, created.status_code) == (202, 202), (job.text, created.text)
    batch_id = created.json()["id"]
    got = await client.get(f"/v1/batches/{batch_id}", headers=OTHER_HOST)
    listed = await client.get("/v1/batches", params={"limit": 100}, headers=OTHER_HOST)
    cancelled = await client.post(f"/v1/batches/{batch_id}/cancel", headers=OTHER_HOST)
    assert cancelled.status_code == 200, cancelled.text
    (in_list,) = [b for b in listed.json()["data"] if b["id"] == batch_id]
    links = {
        "job": job.json()["urls"],
        "job Location": job.headers["Location"],
        "batch": created.json()["urls"],
        "batch Location": created.headers["Location"],
        "get": got.json()["urls"],
        "list": in_list["urls"],
        "cancel": cancelled.json()["urls"],
    }
    return batch_id, links


def _expected(base: str, job_id: str, batch_id: str) -> dict[str, Any]:
    job, batch = f"{base}/v1/jobs/{job_id}", f"{base}/v1/batches/{batch_id}"
    batch_urls = {"self": batch, "output": f"{batch}/output", "errors": f"{batch}/errors"}
    return {
        "job": {"self": job, "events": f"{job}/events"},
        "job Location": job,
        "batch": batch_urls,
        "batch Location": batch,
        "get": batch_urls,
        "list": batch_urls,
        "cancel": batch_urls,
    }


async def test_every_link_uses_the_public_url_under_its_path_prefix(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with app_client(create_app(_settings(redis_url, "https://example.com/conveyor/"))) as c:
        batch_id, links = await _links(c)
    job_id = links["job Location"].rsplit("/", 1)[-1]
    assert links == _expected("https://example.com/conveyor", job_id, batch_id)
    assert "internal.example" not in json.dumps(links)
    event = await _batch_event(aredis, batch_id)
    assert event["urls"] == links["get"]  # absolute, as `GET /v1/batches/{id}` answers


async def test_unset_links_follow_the_request_and_the_webhook_stays_relative(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with app_client(create_app(_settings(redis_url, ""))) as client:
        batch_id, links = await _links(client)
    job_id = links["job Location"].rsplit("/", 1)[-1]
    assert links == _expected("http://internal.example:8080", job_id, batch_id)
    event = await _batch_event(aredis, batch_id)
    assert event["urls"] == _expected("", job_id, batch_id)["get"]


@pytest.mark.parametrize(
    "value",
    [
        "api.example.com",  # no scheme
        "ftp://api.example.com",
        "https://",  # no host
        "https://api.example.com:0",
        "https://api.example.com/?tenant=a",
        "https://api.example.com/#top",
        "https://user:secret@api.example.com",  # credentials in every link
        "https://api.example.com/\n",  # a secret file's newline
        "https://api example.com",
    ],
)
def test_a_bad_public_url_is_refused_at_load_naming_the_setting(value: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(public_url=value)
    assert bad_setting(refused.value).startswith("bad setting: CONVEYOR_PUBLIC_URL="), refused


def test_a_process_given_a_bad_public_url_stops_with_one_line(
    settings_env: Callable[..., None],
) -> None:
    settings_env(CONVEYOR_PUBLIC_URL="api.example.com")
    with pytest.raises(
        SystemExit, match=r"^Error: bad setting: CONVEYOR_PUBLIC_URL='api\.example\.com'"
    ):
        settings_or_exit()


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("", ""),
        ("https://api.example.com/", "https://api.example.com"),
        ("http://10.0.0.5:8080/conveyor/", "http://10.0.0.5:8080/conveyor"),
    ],
)
def test_a_public_url_is_kept_without_its_trailing_slash(value: str, kept: str) -> None:
    assert Settings(public_url=value).public_url == kept
