"""A batch's output or errors file refused on the Files API: an unknown batch's 404 answered as
the file's, told from the file's own (expired) 404 by the batch's error type (`BatchNotFound`),
not by whether its message named the file id, a match that broke silently as a message changed
or named the id by chance. Each answer on a producer run in-process on a real Valkey, as it was."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.batch_api.serving import not_found as batch_not_found
from producer_api.errors import ConveyorError
from producer_api.files.serving import naming_the_file
from tests.test_files_api import FILE, KEYS, _key, _producer

FILE_ID = f"batch_{uuid.uuid4().hex}-output"
TTL_S = 7200  # the result TTL: how long an ended batch's files are kept


def _refusal(status: int, message: str) -> tuple[int, dict[str, object]]:
    """A Files API refusal as OpenAI's API answers it, naming the file (`param` id)."""
    body = {"message": message, "type": "invalid_request_error", "param": "id", "code": None}
    return status, {"error": body}


def test_an_unknown_batch_is_told_by_its_type_even_when_its_message_names_the_file() -> None:
    """A batch's 404 whose message names the file id (by chance) is still the file's 404: it
    answered the batch's message."""
    with pytest.raises(ConveyorError) as refused, naming_the_file(FILE_ID):
        raise batch_not_found(FILE_ID)
    assert (refused.value.status, refused.value.message) == (404, f"file {FILE_ID} not found")
    assert refused.value.param == "id"


def test_a_files_own_404_keeps_its_message_whatever_it_says() -> None:
    """The file's own 404 (it expired) is answered as the batch gave it, with the file's
    `param`: one whose message did not name the file was answered as an unknown file's."""
    with pytest.raises(ConveyorError) as refused, naming_the_file(FILE_ID):
        raise ConveyorError(404, "not_found", "the output file expired an hour ago")
    assert (refused.value.status, refused.value.message) == (
        404,
        "the output file expired an hour ago",
    )
    assert refused.value.param == "id"


async def _batch(client: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    """A batch of one line no worker runs: in progress until it is cancelled."""
    jsonl = {**auth, "Content-Type": "application/jsonl"}
    created = await client.post(
        "/v1/batches",
        params={"model": "identity", "completion_window": "1h"},
        content=FILE,
        headers=jsonl,
    )
    assert created.status_code == 202, created.text
    batch: dict[str, Any] = created.json()
    return batch


async def test_a_batchs_file_refusals_answer_as_they_did(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """Retrieve, content and delete of a file whose batch is unknown, another tenant's, still
    running, or whose file expired: the status and body each answered before."""
    acme = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    globex = await _key(aredis, f"globex-{uuid.uuid4().hex[:8]}")
    async with _producer(redis_url, result_ttl_s=TTL_S) as client:
        running, ended = [await _batch(client, acme) for _ in range(2)]
        cancelled = (await client.post(f"/v1/batches/{ended['id']}/cancel", headers=acme)).json()
        assert cancelled["status"] == "cancelled", cancelled
        # its files expired: it ended longer ago than the result TTL
        await aredis.hset(KEYS.batch(ended["id"]), "cancelled_at", 1000)
        unknown = f"batch_{uuid.uuid4().hex}-errors"
        expected = {
            (unknown, "acme"): _refusal(404, f"file {unknown} not found"),
            (f"{running['id']}-output", "globex"): _refusal(
                404, f"file {running['id']}-output not found"
            ),
            (f"{running['id']}-output", "acme"): _refusal(
                409, f"batch {running['id']} is in_progress; its files are ready when it ends"
            ),
            (f"{ended['id']}-errors", "acme"): _refusal(
                404, f"file {ended['id']}-errors not found: it expired at {1 + TTL_S}"
            ),
        }
        auths = {"acme": acme, "globex": globex}
        for (file_id, tenant), answer in expected.items():
            for method, path in [
                ("GET", f"/v1/files/{file_id}"),
                ("GET", f"/v1/files/{file_id}/content"),
                ("DELETE", f"/v1/files/{file_id}"),
            ]:
                got = await client.request(method, path, headers=auths[tenant])
                assert (got.status_code, got.json()) == answer, (method, path, tenant)
                retry = "false" if got.status_code == 409 else None
                assert got.headers.get("x-should-retry") == retry, (method, path)
