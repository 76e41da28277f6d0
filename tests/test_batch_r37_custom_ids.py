"""A batch line whose JSON parses but holds a value no job may hold (an integer past 64 bits, a
number past a float's range, a lone surrogate, a body nested too deep, Python's `NaN`) names its
request: its errors line carries its `custom_id`, and the id is held as every refused line's
is, so a later line with it is a `duplicate_custom_id`. The line was refused with `custom_id`
null, so a client matching results by id could not tell which request failed, and a later line
with the same id ran. A producer run in-process on a real Valkey; every line is refused, so the
batch ends `failed` at its create and no worker is needed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

KEYS = Keys("batch-r37-ids:")
MAX_DEPTH = 8
JSONL = {"Content-Type": "application/jsonl"}


def _nested(depth: int) -> str:
    """A job body nested `depth` levels, counted from the body."""
    return '{"inputs": ' * (depth - 1) + "{}" + "}" * (depth - 1)


# (custom_id, a line naming it whose JSON no job may hold), then what each refusal says.
UNSTORABLE = [
    ("huge-int", '{"custom_id": "huge-int", "body": {"inputs": {"n": 99999999999999999999}}}'),
    ("past-float", '{"custom_id": "past-float", "body": {"inputs": {"x": 1e400}}}'),
    ("surrogate", '{"custom_id": "surrogate", "body": {"inputs": {"s": "\\ud800"}}}'),
    ("too-deep", f'{{"custom_id": "too-deep", "body": {_nested(MAX_DEPTH + 1)}}}'),
    ("nan", '{"custom_id": "nan", "body": {"inputs": {"x": NaN}}}'),
]
SAYS = ["does not fit in 64 bits", "not finite", "lone surrogate", "nested deeper", "NaN"]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    """After `aredis` has flushed the database."""
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", max_json_depth=MAX_DEPTH
    )
    async with app_client(create_app(settings)) as client:
        yield client


async def _errors(producer: httpx.AsyncClient, source: str) -> list[dict[str, object]]:
    """The errors file of a batch of `source`, every line of which is refused."""
    created = await producer.post(
        "/v1/batches", params={"model": "identity"}, content=source, headers=JSONL
    )
    assert created.status_code == 202, created.text
    assert created.json()["status"] == "failed", created.text
    errors = await producer.get(f"/v1/batches/{created.json()['id']}/errors")
    assert errors.status_code == 200, errors.text
    return [json.loads(line) for line in errors.text.splitlines()]


async def test_a_line_refused_for_a_value_names_its_custom_id(
    producer: httpx.AsyncClient,
) -> None:
    errors = await _errors(producer, "\n".join(line for _, line in UNSTORABLE) + "\n")

    assert [(e["line"], e["custom_id"]) for e in errors] == [
        (number, custom_id) for number, (custom_id, _) in enumerate(UNSTORABLE, start=1)
    ]
    assert {e["error"]["type"] for e in errors} == {"invalid_json"}  # as before
    for error, says in zip(errors, SAYS, strict=True):
        assert says in error["error"]["message"], error


async def test_its_custom_id_is_held_as_any_refused_lines(producer: httpx.AsyncClient) -> None:
    """A later line with the id is a duplicate, not a second request under the same id."""
    again = '{"custom_id": "huge-int", "body": {"inputs": {"n": 1}}}'

    errors = await _errors(producer, f"{UNSTORABLE[0][1]}\n{again}\n")

    assert [(e["custom_id"], e["error"]["type"]) for e in errors] == [
        ("huge-int", "invalid_json"),
        ("huge-int", "duplicate_custom_id"),
    ]


async def test_a_line_that_is_no_json_or_whose_id_is_unstorable_names_none(
    producer: httpx.AsyncClient,
) -> None:
    """Text that does not parse has no id to name, and an id that is itself a lone surrogate
    is not one the errors file can hold: both refused as before, `custom_id` null."""
    source = '{"custom_id": "cut", "body": {\n{"custom_id": "\\udfff", "body": {}}\n'

    errors = await _errors(producer, source)

    assert [(e["line"], e["custom_id"], e["error"]["type"]) for e in errors] == [
        (1, None, "invalid_json"),
        (2, None, "invalid_json"),
    ]
