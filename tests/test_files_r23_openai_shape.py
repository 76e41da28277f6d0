"""The Files API as OpenAI's clients read it, on a producer run in-process on a real Valkey: a
`%` in a name was sent as is in the plain `filename`, which clients that percent-decode it saved
as another name (`a%20b` as `a b`), and an unknown file's 404 and a running batch's file's 409
answered in Conveyor's shape, not OpenAI's (`openai.NotFoundError` read no message)."""

from __future__ import annotations

import uuid
from email.message import Message

import pytest
import redis.asyncio as aioredis
from openai import ConflictError, NotFoundError

from tests.test_files_api import FILE, _key, _producer
from tests.test_files_r15_content import named
from tests.test_files_r22_download_name import openai_sdk


def plain_filename(disposition: str) -> str:
    """The `filename` a client reading only that parameter saves under."""
    parsed = Message()
    parsed["Content-Disposition"] = disposition
    return str(parsed.get_param("filename", header="content-disposition"))


async def test_a_percent_in_a_name_is_not_sent_in_the_plain_filename(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """`filename*` keeps the exact name (its `%` percent-encoded); the plain stand-in has no
    `%` a client could decode."""
    auth = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        files = {"file": ("a%20b%2.jsonl", FILE)}
        uploaded = await client.post(
            "/v1/files", files=files, data={"purpose": "batch"}, headers=auth
        )
        assert uploaded.json()["filename"] == "a%20b%2.jsonl", uploaded.text
        content = await client.get(f"/v1/files/{uploaded.json()['id']}/content", headers=auth)
        disposition = content.headers["content-disposition"]
        assert named(disposition.encode()) == "a%20b%2.jsonl"
        assert plain_filename(disposition) == "a_20b_2.jsonl", disposition


async def test_every_files_refusal_is_in_openais_shape(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """An unknown file (a malformed id too) on each route, and a running batch's output file:
    `invalid_request_error` with its message and the `id` it names, as OpenAI's API answers."""
    auth = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        sdk = openai_sdk(client, auth)
        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=FILE,
            headers={**auth, "Content-Type": "application/jsonl"},
        )
        assert created.status_code == 202, created.text
        running = f"{created.json()['id']}-output"
        unknown = [f"file-{uuid.uuid4().hex}", "nope", f"batch_{uuid.uuid4().hex}-errors"]
        calls = [sdk.files.retrieve, sdk.files.content, sdk.files.delete]
        for file_id in unknown:
            for call in calls:
                with pytest.raises(NotFoundError) as missing:
                    await call(file_id)
                assert missing.value.body == {
                    "message": missing.value.body["message"],  # type: ignore[index]
                    "type": "invalid_request_error",
                    "param": "id",
                    "code": None,
                }, (call, file_id)
                assert file_id in missing.value.message
        for call in calls:
            with pytest.raises(ConflictError) as early:
                await call(running)
            assert early.value.body["type"] == "invalid_request_error"  # type: ignore[index]
            assert "ready when it ends" in early.value.message
