"""A download's name as a client saves it, on a producer run in-process on a real Valkey: an
upload named with a path (`../../x.jsonl`, as a browser's or a script's upload may be) was named
so in the download's Content-Disposition, both the plain `filename` and the `filename*`, so a
client that saves a download under the name it is given wrote outside the folder it saved to."""

from __future__ import annotations

import uuid

import httpx
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from tests.test_files_api import FILE, _key, _producer
from tests.test_files_r15_content import named


async def test_a_download_of_a_file_named_with_a_path_is_named_by_one_segment(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The file object keeps the name as uploaded; the download's name has no `/` in either
    parameter, so it cannot climb out of (or into a folder below) where it is saved."""
    auth = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        sdk = openai_sdk(client, auth)
        uploaded = await sdk.files.create(file=("../../etc/x.jsonl", FILE), purpose="batch")
        assert uploaded.filename == "../../etc/x.jsonl"
        content = await sdk.files.with_raw_response.content(uploaded.id)
        disposition = content.headers["content-disposition"]
        assert "/" not in disposition, disposition
        assert named(disposition.encode()) == ".._.._etc_x.jsonl"
        assert content.content == FILE


def openai_sdk(client: httpx.AsyncClient, auth: dict[str, str]) -> AsyncOpenAI:
    """OpenAI's SDK on the in-process producer `client`, with the key of `auth`, no retries."""
    return AsyncOpenAI(
        base_url="http://test/v1",
        api_key=auth["Authorization"].removeprefix("Bearer "),
        http_client=client,
        max_retries=0,
    )
