"""What a client named in a request's headers or a batch's metadata is quoted back cut short,
never whole: a Content-Encoding or Content-Type header of 10 kB came back whole in its 415 or
422, as did a batch's metadata key of 60 kB in its 400 (twice: message and `param`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from producer_api.app import create_app
from shared.model_repository import QUOTED_CHARS
from shared.problem_list import LISTED_PROBLEMS
from shared.settings import Settings
from tests.app_client import app_client

LONG = "z" * 10_000
# the message's own words around the quoted name, well under this
SHORT_MESSAGE = QUOTED_CHARS + 400
JOB = b'{"model": "identity", "inputs": {}}'


def _settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, auth="disabled", instance_id="r35-echo-names")


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(create_app(_settings(redis_url))) as client:
        yield client


@pytest.mark.parametrize(
    ("headers", "status", "words"),
    [
        ({"content-type": "application/json", "content-encoding": LONG}, 415, "Content-Encoding "),
        ({"content-type": f"text/{LONG}"}, 422, "(this request's is "),
    ],
)
async def test_a_long_header_is_quoted_short(
    client: httpx.AsyncClient, headers: dict[str, str], status: int, words: str
) -> None:
    answer = await client.post("/v1/jobs", content=JOB, headers=headers)
    assert answer.status_code == status, answer.text[:300]
    message = answer.json()["error"]["message"]
    assert f'{words}"' in message and "characters of JSON)" in message, message[:300]
    assert len(message) < SHORT_MESSAGE


async def test_a_short_content_type_is_named_as_sent(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/jobs", content=JOB, headers={"content-type": "text/plain"})
    assert answer.status_code == 422, answer.text
    assert "(this request's is text/plain; curl needs" in answer.json()["error"]["message"]


async def test_a_long_metadata_key_of_a_batch_is_quoted_short(client: httpx.AsyncClient) -> None:
    answer = await client.post(
        "/v1/batches",
        json={
            "input_file_id": "file-x",
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
            "metadata": {LONG: "a"},
        },
    )
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"].startswith('metadata."zzz')
    assert error["param"].endswith(f"… ({len(LONG) + 2} characters of JSON).[key]")
    assert error["message"] == f"{error['param']}: String should have at most 64 characters"
    assert len(error["message"]) < SHORT_MESSAGE


async def test_a_long_unknown_field_of_a_batch_line_is_quoted_short(
    client: httpx.AsyncClient,
) -> None:
    line = {"custom_id": "a", "body": {"model": "identity", "inputs": {}}, LONG: 1}
    upload = await client.post(
        "/v1/files",
        files={"file": ("lines.jsonl", orjson.dumps(line))},
        data={"purpose": "batch"},
    )
    assert upload.status_code == 200, upload.text
    answer = await client.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/jobs",
            "completion_window": "24h",
        },
    )
    assert answer.status_code == 202, answer.text[:300]
    (error,) = answer.json()["errors"]["data"]
    assert error["message"].startswith('"zzz')
    assert error["message"].endswith(
        f"… ({len(LONG) + 2} characters of JSON): Extra inputs are not permitted"
    )


async def test_a_refusal_of_many_wrong_fields_names_the_first_and_counts_the_rest(
    client: httpx.AsyncClient,
) -> None:
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": 1}] * 500}
    batch = {
        "input_file_id": "file-x",
        "endpoint": "/v1/embeddings",
        "completion_window": "24h",
        "metadata": {f"{i:065d}": "a" for i in range(500)},
    }
    for route, body in (("/v1/chat/completions", chat), ("/v1/batches", batch)):
        answer = await client.post(route, json=body)
        assert answer.status_code == 400, answer.text[:300]
        said = answer.json()["error"]["message"].split("; ")
        assert len(said) == LISTED_PROBLEMS + 1, said[-1]
        assert said[-1] == f"and {500 - LISTED_PROBLEMS} more"


@pytest.mark.parametrize(
    ("url", "status", "start"),
    [
        (f"/console/jobs?status={LONG}", 422, 'no job status "zzz'),
        (f"/console/dead-letters?after={LONG}", 422, 'after: "zzz'),
        (f"/console/batches/{LONG}/output", 404, 'batch "zzz'),
        (f"/console/dead-letters/confirm?action=replay&partition={LONG}", 404, 'no partition "zzz'),
        (
            f"/console/dead-letters/confirm?action=discard&partition=minilm:default&entry={LONG}",
            404,
            'no dead letter "zzz',
        ),
    ],
)
async def test_a_long_console_query_or_path_is_quoted_short(
    client: httpx.AsyncClient, url: str, status: int, start: str
) -> None:
    answer = await client.get(url)
    assert answer.status_code == status, answer.text[:300]
    message = answer.json()["error"]["message"]
    assert message.startswith(start) and "characters of JSON)" in message, message[:300]
    assert len(message) < SHORT_MESSAGE


async def test_a_chat_part_of_a_long_type_is_quoted_short(client: httpx.AsyncClient) -> None:
    part = {"role": "user", "content": [{"type": LONG}]}
    answer = await client.post(
        "/v1/chat/completions", json={"model": "smollm2", "messages": [part]}
    )
    assert answer.status_code == 400, answer.text[:300]
    message = answer.json()["error"]["message"]
    assert message.startswith('messages.0.content.0: "zzz'), message[:300]
    assert message.endswith("characters of JSON) parts are not taken: the model reads text only")
    assert len(message) < SHORT_MESSAGE
