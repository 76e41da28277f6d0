"""The files resource on a producer run in-process on a real Valkey, with API keys: a tenant's
uploads are held to a storage budget (a loop of uploads filled Redis to its maxmemory, and every
tenant's submits were 503s), and a batch's output and errors files answer OpenAI's delete (it was
a 404, though their content is served under the same ids)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from producer_api.app import create_app
from shared.api_keys import ApiKeyStore, KeySpec
from shared.file_store import charged
from shared.keys import Keys
from shared.settings import Settings

KEYS = Keys("files-api:")
SCOPES = frozenset({"submit", "read"})
FILE = b'{"custom_id": "a", "body": {"inputs": {"x": 1}}}\n'  # 49 bytes


async def _key(aredis: aioredis.Redis, tenant: str) -> dict[str, str]:
    api_key, _ = await ApiKeyStore(aredis, KEYS).create(KeySpec(tenant=tenant, scopes=SCOPES))
    return {"Authorization": f"Bearer {api_key}"}


@asynccontextmanager
async def _producer(redis_url: str, **settings: int) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def _upload(
    client: httpx.AsyncClient, auth: dict[str, str], name: str = "a.jsonl"
) -> httpx.Response:
    files = {"file": (name, FILE)}
    return await client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=auth)


async def test_a_tenants_uploads_are_held_to_its_storage_budget(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Two files fit a budget of a little over two, a third does not until one is deleted;
    another tenant's budget is its own."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    globex = await _key(aredis, f"globex-{uuid.uuid4().hex[:8]}")
    async with _producer(
        redis_url, max_file_bytes_per_tenant=2 * charged("a.jsonl", len(FILE)) + 2
    ) as client:
        kept = [(await _upload(client, acme)).json()["id"] for _ in range(2)]
        files_before = len(await aredis.keys(KEYS.file("*")))
        refused = await _upload(client, acme)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "insufficient_quota"
        assert refused.headers["x-should-retry"] == "false"  # it frees only by a delete
        assert len(await aredis.keys(KEYS.file("*"))) == files_before  # nothing stored
        assert (await _upload(client, globex)).status_code == 200

        deleted = await client.delete(f"/v1/files/{kept[0]}", headers=acme)
        assert deleted.json() == {"id": kept[0], "object": "file", "deleted": True}
        again = await client.delete(f"/v1/files/{kept[0]}", headers=acme)
        assert again.status_code == 404  # and the budget is not given back twice
        assert (await _upload(client, acme)).status_code == 200
        assert (await _upload(client, acme)).status_code == 429


async def test_a_files_name_counts_against_the_budget_and_is_bounded(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Only a file's content counted: 1-byte files with ~4 KB names (python-multipart's header
    limit) filled Redis while barely touching the budget. A name over 255 bytes is refused,
    and each file holds its name and a fixed overhead besides its content."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url, max_file_bytes_per_tenant=2000) as client:
        files_before = len(await aredis.keys(KEYS.file("*")))
        long = await _upload(client, acme, "é" * 150)  # 300 bytes of UTF-8
        assert long.status_code == 400, long.text
        assert "255 bytes" in long.json()["error"]["message"]
        assert len(await aredis.keys(KEYS.file("*"))) == files_before  # nothing stored
        name = "n" * 250  # 3 files' content is 147 bytes, their names and overhead 2286
        assert [(await _upload(client, acme, name)).status_code for _ in range(2)] == [200, 200]
        refused = await _upload(client, acme, name)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["type"] == "insufficient_quota"


async def test_a_batchs_own_files_answer_openais_delete(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """OpenAI's clients delete a batch's output file after reading it: a 409 while the batch
    runs, a 404 for another tenant's, then `deleted: false` (they go with the batch) and the
    file still served."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    globex = await _key(aredis, f"globex-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=FILE,
            headers={**acme, "Content-Type": "application/jsonl"},
        )
        assert created.status_code == 202, created.text
        batch_id = created.json()["id"]
        output = f"{batch_id}-output"
        running = await client.delete(f"/v1/files/{output}", headers=acme)
        assert running.status_code == 409, running.text
        cancelled = await client.post(f"/v1/batches/{batch_id}/cancel", headers=acme)
        assert cancelled.json()["status"] == "cancelled", cancelled.text
        theirs = await client.delete(f"/v1/files/{output}", headers=globex)
        assert theirs.status_code == 404, theirs.text

        openai = AsyncOpenAI(
            base_url="http://test/v1",
            api_key=acme["Authorization"].removeprefix("Bearer "),
            http_client=client,
            max_retries=0,
        )
        errors = f"{batch_id}-errors"
        answer = await openai.files.delete(errors)
        assert (answer.id, answer.object, answer.deleted) == (errors, "file", False)
        assert (await openai.files.retrieve(errors)).id == errors  # still served
        # no line succeeded: the batch names no output file, which is not there to delete
        assert (await client.delete(f"/v1/files/{output}", headers=acme)).status_code == 404


async def test_a_purpose_other_than_batch_is_refused_by_name(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """OpenAI's `user_data` (or `vision`, …) is a 400 whose message names it and the one
    purpose Conveyor keeps (it said only "Input should be 'batch'"); nothing is stored."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        refused = await client.post(
            "/v1/files",
            files={"file": ("a.jsonl", FILE)},
            data={"purpose": "user_data"},
            headers=acme,
        )
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert "'user_data' is not supported" in message and "'batch'" in message
        assert await aredis.keys(KEYS.file("*")) == []


async def test_an_uploaded_files_content_comes_with_its_length(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """An upload's bytes are read whole, so they are sent with their Content-Length (they went
    chunked, and a client could not tell a cut download from a whole one); JSONL, as stored."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url) as client:
        file_id = (await _upload(client, acme)).json()["id"]
        content = await client.get(f"/v1/files/{file_id}/content", headers=acme)
        assert content.status_code == 200, content.text
        assert content.content == FILE
        assert content.headers["content-length"] == str(len(FILE))
        assert content.headers["content-type"] == "application/jsonl"
