"""Batch input is held to its own bound, `CONVEYOR_MAX_UPLOAD_BYTES`, not to the 1 MiB every
other body is: 10,000 lines of embedding requests pass 1 MiB, so a batch a lane could hold was a
413 (OpenAI takes files of 200 MB and 50,000 lines). On a producer run in-process on a real
Valkey, both bounds made small."""

from __future__ import annotations

from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from tests.test_files_api import KEYS, _key, _producer

BODY_BYTES, UPLOAD_BYTES = 4096, 65_536


def jsonl(lines: int) -> bytes:
    """`lines` batch lines of ~100 bytes each."""
    line = b'{"custom_id": "c%05d", "body": {"inputs": {"text": "' + b"x" * 40 + b'"}}}\n'
    return b"".join(line.replace(b"%05d", b"%05d" % n) for n in range(lines))


async def test_batch_input_past_the_body_limit_is_taken_up_to_the_upload_limit(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    lines = 200
    data = jsonl(lines)
    assert BODY_BYTES < len(data) < UPLOAD_BYTES
    limits = {"max_body_bytes": BODY_BYTES, "max_upload_bytes": UPLOAD_BYTES}
    auth = await _key(aredis, "uploader")
    async with _producer(redis_url, **limits) as client:
        client.headers.update(auth)
        files = {"file": ("big.jsonl", data)}
        uploaded = await client.post("/v1/files", files=files, data={"purpose": "batch"})
        assert uploaded.status_code == 200, uploaded.text
        assert uploaded.json()["bytes"] == len(data)
        named = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/jobs"}
        by_file = await client.post("/v1/batches", params={"model": "identity"}, json=named)
        jsonl_body = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=data,
            headers={"Content-Type": "application/jsonl"},
        )
        for created in (by_file, jsonl_body):
            assert created.status_code == 202, created.text
            assert created.json()["request_counts"]["total"] == lines

        job = {"model": "identity", "inputs": {"text": data.decode()[:UPLOAD_BYTES]}}
        refused = await client.post("/v1/jobs", json=job)
        assert refused.status_code == 413, refused.text
        assert "CONVEYOR_MAX_BODY_BYTES" in refused.json()["error"]["message"]


async def test_batch_input_past_the_upload_limit_is_413_declared_or_chunked(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    data = jsonl(UPLOAD_BYTES // 80)
    assert len(data) > UPLOAD_BYTES

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 8192):
            yield data[start : start + 8192]

    files_before = len(await aredis.keys(KEYS.file("*")))
    limits = {"max_body_bytes": BODY_BYTES, "max_upload_bytes": UPLOAD_BYTES}
    auth = await _key(aredis, "uploader")
    async with _producer(redis_url, **limits) as client:
        client.headers.update(auth)
        refusals = [
            await client.post(
                "/v1/files", files={"file": ("big.jsonl", data)}, data={"purpose": "batch"}
            ),
            await client.post(
                "/v1/batches",
                params={"model": "identity"},
                content=chunked(),
                headers={"Content-Type": "application/jsonl"},
            ),
        ]
    for refused in refusals:
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["type"] == "payload_too_large"
        assert f"{UPLOAD_BYTES} bytes (CONVEYOR_MAX_UPLOAD_BYTES)" in error["message"]
    assert len(await aredis.keys(KEYS.file("*"))) == files_before
