"""A file's content as it is downloaded, on a producer run in-process on a real Valkey: an
upload's bytes exactly as uploaded (binary, CRLF, no final newline), named by its filename in a
`Content-Disposition` (RFC 6266) that no filename breaks, and a batch's output file by its id.
There was none, so a browser or `curl -OJ` saved every download as `content`."""

from __future__ import annotations

import uuid
from email.message import Message
from email.utils import collapse_rfc2231_value

import redis.asyncio as aioredis

from producer_api.files.api_router import attachment
from tests.test_files_api import FILE, _key, _producer

BOUNDARY = "r15boundary"
UPLOADS = [
    ('say "hi"; x=y.jsonl', b'{"a": 1}\r\n{"b": 2}'),  # CRLF, no final newline
    ("données ✓ 日本.jsonl", b"\x00\xff\xfe\r\n\x80 binary"),
    ("back\\slash%41.jsonl", b"{}\n"),
]


def multipart(filename: str, data: bytes) -> bytes:
    """An upload whose filename is a quoted string (RFC 7578) in raw UTF-8 with `\\"` escapes,
    as browsers and curl send it (httpx percent-encodes a quote)."""
    quoted = filename.replace("\\", "\\\\").replace('"', '\\"')
    purpose = 'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch'
    file = f'Content-Disposition: form-data; name="file"; filename="{quoted}"\r\n\r\n'
    head = f"--{BOUNDARY}\r\n{purpose}\r\n--{BOUNDARY}\r\n{file}"
    return head.encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def named(disposition: bytes) -> str:
    """The name a client reading RFC 6266 saves a download under (`filename*`), checking the
    header is ASCII on one line with one plain `filename` beside it."""
    assert disposition.isascii() and not {13, 10} & set(disposition), disposition
    parsed = Message()
    parsed["Content-Disposition"] = disposition.decode()
    kind, *params = parsed.get_params(header="content-disposition") or [("", "")]
    assert kind == ("attachment", "")
    names = [value for key, value in params if key == "filename"]
    assert [isinstance(value, str) for value in names] == [True, False], params
    return collapse_rfc2231_value(names[1])


async def test_a_download_is_the_uploaded_bytes_named_by_their_filename(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    auth = await _key(aredis, f"acme-{uuid.uuid4().hex[:8]}")
    form = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    async with _producer(redis_url) as client:
        client.headers.update(auth)
        for filename, data in UPLOADS:
            uploaded = await client.post(
                "/v1/files", content=multipart(filename, data), headers=form
            )
            assert uploaded.json()["filename"] == filename, uploaded.text
            content = await client.get(f"/v1/files/{uploaded.json()['id']}/content")
            assert content.status_code == 200, content.text
            assert (content.content, content.headers["content-length"]) == (data, str(len(data)))
            saved = filename.replace("\\", "_")  # no separator a client would follow
            assert named(dict(content.headers.raw).get(b"content-disposition", b"")) == saved

        created = await client.post(
            "/v1/batches",
            params={"model": "identity"},
            content=FILE,
            headers={"Content-Type": "application/jsonl"},
        )
        batch_id = created.json()["id"]
        await client.post(f"/v1/batches/{batch_id}/cancel")
        errors = await client.get(f"/v1/files/{batch_id}-errors/content")
        assert errors.status_code == 200, errors.text
        # named as its file object names it, as OpenAI's
        assert named(errors.headers["content-disposition"].encode()) == f"{batch_id}_errors.jsonl"
        # no line succeeded: its view names no output file, so there is none (it was 200, empty)
        assert (await client.get(f"/v1/files/{batch_id}-output/content")).status_code == 404


def test_a_name_with_a_newline_or_a_quote_keeps_the_header_whole() -> None:
    """Names stored before uploads were parsed as now, or put by another client's parser."""
    for filename in ('a"\r\nSet-Cookie: x=1.jsonl', "tab\there\x7f.jsonl", "%22.jsonl"):
        assert named(attachment(filename)["Content-Disposition"].encode()) == filename
