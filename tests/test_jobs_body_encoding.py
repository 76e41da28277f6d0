"""A job body sent with a `Content-Encoding` (gzip, br...), through the real producer and a real
Valkey. The producer decodes none: a gzipped body was read as if it were plain, refused as "not
acceptable JSON: 'utf-8' codec can't decode byte 0x8b", which sent its client looking for a
fault in its JSON, and a plain one labelled gzip was taken as it came. Either is 415 now, naming
the coding and with `Accept-Encoding: identity` (RFC 9110 15.5.16), and nothing is enqueued."""

from __future__ import annotations

import gzip

import httpx
import orjson
import pytest
import redis

from shared.keys import Keys

pytestmark = pytest.mark.slow
BODY = orjson.dumps({"model": "identity", "variant": "canary", "inputs": {"x": 1}})
LANE = Keys().queue("identity", "canary")  # no worker serves it: an entry would stay


def _post(base_url: str, body: bytes, coding: str) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": coding}
    return httpx.post(f"{base_url}/v1/jobs", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("body", "coding"),
    [(gzip.compress(BODY), "gzip"), (BODY, "gzip"), (BODY, "br"), (BODY, "identity, gzip")],
    ids=["gzipped", "labelled-gzip", "br", "two-codings"],
)
def test_a_body_in_a_content_coding_is_415_and_nothing_is_enqueued(
    base_url: str, stack_redis: redis.Redis, body: bytes, coding: str
) -> None:
    before = stack_redis.xlen(LANE)
    response = _post(base_url, body, coding)
    assert response.status_code == 415, response.text
    assert response.headers["accept-encoding"] == "identity"
    error = response.json()["error"]
    assert error["type"] == "unsupported_media_type", error
    assert "Content-Encoding" in error["message"] and "uncompressed" in error["message"], error
    assert stack_redis.xlen(LANE) == before


def test_an_identity_coding_is_the_body_as_sent(base_url: str) -> None:
    response = _post(base_url, BODY, "Identity")
    assert response.status_code == 202, response.text
    httpx.delete(f"{base_url}/v1/jobs/{response.json()['id']}", timeout=30)  # its lane left bare
