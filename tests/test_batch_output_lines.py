"""What an OpenAI client reads of a Batch API batch's lines: a chat or completion line's body is
the completion as made when its job finished (its `created` was the moment the output file was
read, so the file changed from one download to the next and its completions looked made after
the batch had ended), and a `custom_id` is the batch's once whatever the line that named it
first (a refused line took it only when its body was refused, not its line's shape, so a later
line with the same id ran and the id named both a refused line and an output). A producer run
in-process on a real Valkey, spoken to by OpenAI's client; no worker reads its lanes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.batch_api.protocol import CHAT, COMPLETIONS
from producer_api.batch_api.serving import _openai_output
from shared.batch_api_store import ItemState
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

KEYS = Keys("batch-lines:")
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
FINISHED_MS = 1_700_000_000_789  # when the item's job ended (its hash's `finished`)


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_a_completion_line_is_dated_when_its_job_finished(endpoint: str) -> None:
    outputs = json.dumps({"text": "Paris", "finish_reason": "stop", "usage": USAGE}).encode()
    item = ItemState("j1", "succeeded", "a", 1, outputs, None, finished=FINISHED_MS)
    first, again = (_openai_output(endpoint, "smollm2", item) for _ in range(2))
    assert first["response"]["body"]["created"] == FINISHED_MS // 1000
    assert first == again  # every download of the output file reads the same line


@pytest.fixture
async def sdk(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[openai.AsyncOpenAI]:
    """After `aredis` has flushed the database."""
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        yield openai_sdk(client)


def _line(custom_id: str, **extra: object) -> str:
    body = {"model": "identity", "inputs": {"x": 1}}
    return json.dumps({"custom_id": custom_id, "url": "/v1/jobs", "body": body, **extra})


async def test_a_custom_id_a_refused_line_named_is_not_run_again(
    sdk: openai.AsyncOpenAI,
) -> None:
    """A line refused for its shape (an unknown field, a method other than POST) holds its
    `custom_id` as one refused for its body does: a later line naming it is a duplicate."""
    source = "\n".join(
        [
            _line("a", extra=1),  # the line's shape refused
            _line("a"),
            _line("b", method="GET"),
            _line("b"),
            _line("c", body={"model": "identity"}),  # its body refused: held already
            _line("c"),
            _line("d"),
        ]
    )
    upload = await sdk.files.create(file=("lines.jsonl", source.encode()), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/jobs",  # type: ignore[arg-type]  # Conveyor's own route
        completion_window="24h",
    )
    assert batch.errors is not None and batch.errors.data is not None, batch
    refused = [(error.line, error.code) for error in batch.errors.data]
    assert refused == [
        (1, "invalid_request"),
        (2, "duplicate_custom_id"),
        (3, "invalid_request"),
        (4, "duplicate_custom_id"),
        (5, "invalid_request"),
        (6, "duplicate_custom_id"),
    ]
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.failed) == (7, 6)
