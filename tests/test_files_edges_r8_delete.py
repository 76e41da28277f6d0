"""The Files API's delete and upload on a producer run in-process on a real Valkey: concurrent
deletes of one file all answered `deleted: true` (each had found it before any dropped it), and
an `expires_after[seconds]` sent without OpenAI's `expires_after[anchor]` was taken."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from tests.test_files_api import FILE, KEYS, _key, _producer, _upload


async def test_of_concurrent_deletes_of_a_file_only_the_one_that_dropped_it_says_deleted(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The others answer the 404 an unknown file gets, as OpenAI's delete of a deleted file."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        file_id = (await _upload(client, acme)).json()["id"]
        answers = await asyncio.gather(
            *(client.delete(f"/v1/files/{file_id}", headers=acme) for _ in range(4))
        )
        unknown = await client.delete(f"/v1/files/file-{uuid.uuid4().hex}", headers=acme)
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200, 404, 404, 404], [answer.text for answer in answers]
    deleted = [answer.json() for answer in answers if answer.status_code == 200]
    assert deleted == [{"id": file_id, "object": "file", "deleted": True}]
    refused = next(answer.json()["error"] for answer in answers if answer.status_code == 404)
    assert refused["type"] == unknown.json()["error"]["type"] and file_id in refused["message"]


@pytest.mark.parametrize(
    ("policy", "param"),
    [
        ({"expires_after[seconds]": "3600"}, "expires_after[anchor]"),
        ({"expires_after[anchor]": "created_at"}, "expires_after[seconds]"),
        (
            {"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
            "expires_after[anchor]",
        ),
    ],
)
async def test_an_expires_after_without_both_of_openais_fields_is_refused_by_name(
    redis_url: str, aredis: aioredis.Redis, policy: dict[str, str], param: str
) -> None:
    """OpenAI's `expires_after` is anchor `created_at` and seconds together: one without the
    other, or another anchor, is a 400 naming the field, and nothing is stored."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        refused = await client.post(
            "/v1/files",
            files={"file": ("a.jsonl", FILE)},
            data={"purpose": "batch", **policy},
            headers=acme,
        )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    assert await aredis.keys(KEYS.file("*")) == []
