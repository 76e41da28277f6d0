"""No client text reaches a Redis key unchecked (README): file and batch ids are matched whole,
where `^…$` let one with a trailing newline by, and `GET /v1/files/{id}%0A` read the key
`cv:file:…\\n` (a batch's, its hash). Watched with MONITOR on a real Valkey, through a producer
run in-process."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from tests.test_files_api import _key, _producer


async def test_a_file_or_batch_id_with_a_trailing_newline_reaches_no_key(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    digits = uuid.uuid4().hex
    auth = await _key(aredis, "ids")
    sentinel = f"files-ids-{uuid.uuid4().hex}"
    seen: list[str] = []
    async with _producer(redis_url) as client, aredis.monitor() as monitor:
        client.headers.update(auth)
        for method, path in [
            ("GET", f"/v1/files/file-{digits}%0A"),
            ("GET", f"/v1/files/file-{digits}%0A/content"),
            ("DELETE", f"/v1/files/file-{digits}%0A"),
            ("GET", f"/v1/batches/batch_{digits}%0A"),
            ("GET", f"/v1/files/batch_{digits}-output%0A"),
            ("GET", f"/v1/files/batch_{digits}-errors%0A/content"),
        ]:
            response = await client.request(method, path)
            assert response.status_code == 404, (path, response.text)
        await aredis.echo(sentinel)
        while sentinel not in (command := (await monitor.next_command())["command"]):
            seen.append(command)
    assert seen, "MONITOR saw the requests' own commands (the key lookup)"
    assert not [command for command in seen if digits in command]
