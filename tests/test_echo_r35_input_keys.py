"""A job's inputs refused by the model's schema are quoted back cut short, never whole: an
unexpected key of 100 kB (minilm's and smollm2's `additionalProperties: false`) came back whole
in the 422, as did a key refused by `unevaluatedProperties` or `propertyNames` and a key of the
client's own in the refusal's place; and every one of 50,000 wrong items was listed (2.6 MB)."""

from __future__ import annotations

from typing import Any

import pytest

from producer_api.app import create_app
from shared.model_repository import QUOTED_CHARS, ModelConfig
from shared.problem_list import LISTED_PROBLEMS
from shared.settings import Settings
from tests.app_client import app_client

LONG = "x" * 100_000
# the message's own words around the quoted key, well under this
SHORT_MESSAGE = QUOTED_CHARS + 400


def _settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, auth="disabled", instance_id="r35-echo")


@pytest.mark.parametrize(
    ("model", "inputs", "place"),
    [
        ("minilm", {"texts": ["a"], LONG: 1}, "inputs"),
        ("smollm2", {"prompt": "hi", LONG: 1}, "inputs"),
        (
            "smollm2",
            {"messages": [{"role": "user", "content": "a", LONG: 1}]},
            "inputs['messages'][0]",
        ),
    ],
)
async def test_an_unexpected_input_key_is_quoted_short(
    redis_url: str, model: str, inputs: dict[str, Any], place: str
) -> None:
    async with app_client(create_app(_settings(redis_url))) as client:
        answer = await client.post("/v1/jobs", json={"model": model, "inputs": inputs})
    assert answer.status_code == 422, answer.text[:300]
    error = answer.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["message"].startswith(f'{place}: Additional properties are not allowed (["xxx')
    assert f"({len(LONG) + 4} characters of JSON) was unexpected)" in error["message"]
    assert len(error["message"]) < SHORT_MESSAGE


async def test_a_short_unexpected_key_is_named_as_before(redis_url: str) -> None:
    async with app_client(create_app(_settings(redis_url))) as client:
        answer = await client.post(
            "/v1/jobs", json={"model": "minilm", "inputs": {"texts": ["a"], "typo": 1}}
        )
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert message == "inputs: Additional properties are not allowed ('typo' was unexpected)"


async def test_a_refusal_lists_the_first_problems_and_counts_the_rest(redis_url: str) -> None:
    async with app_client(create_app(_settings(redis_url))) as client:
        answer = await client.post(
            "/v1/jobs", json={"model": "minilm", "inputs": {"texts": [1] * 300}}
        )
    assert answer.status_code == 422, answer.text[:300]
    error = answer.json()["error"]
    said = error["message"].split("; ")
    # maxItems over the whole list, then one for each of its 300 items
    assert len(said) == LISTED_PROBLEMS + 1
    assert said[-1] == f"and {301 - LISTED_PROBLEMS} more"
    assert said[1] == "inputs['texts'][0]: 1 is not of type \"string\""


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"unevaluatedProperties": False}, "Unevaluated properties are not allowed ("),
        ({"propertyNames": {"maxLength": 8}}, '"xxx'),
        ({"additionalProperties": {"type": "integer"}}, '"a" is not of type "integer"'),
    ],
)
def test_a_long_key_of_other_schemas_is_quoted_short(schema: dict[str, Any], why: str) -> None:
    config = ModelConfig(
        name="keys", kind="batch", backend="identity", input_schema={"type": "object", **schema}
    )
    (error,) = config.input_errors({LONG: "a"})
    assert why in error
    assert (
        f"({len(LONG) + 2} characters of JSON)" in error or f"({len(LONG) + 4} characters" in error
    )
    assert len(error) < SHORT_MESSAGE
