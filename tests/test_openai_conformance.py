"""What OpenAI's SDK and vLLM's own clients read of the OpenAI-compatible routes, as vLLM's
server answers it: the model cards' fields vLLM's benchmark reads, and the `param` of a refusal
naming the field the client sent, never a branch of the validator's union. A producer served
in-process over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client, openai_sdk

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def producer(redis_url: str, aredis: aioredis.Redis) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-conformance")
    async with app_client(create_app(settings)) as client:
        yield client


async def test_model_cards_carry_vllms_root_and_max_model_len(
    producer: httpx.AsyncClient,
) -> None:
    """`vllm bench serve` without `--model` reads the first card's `id` and `root` (a KeyError
    that ended the run, without `root`); vLLM's cards also say the context (`max_model_len`)."""
    listing = (await producer.get("/v1/models")).json()
    first = listing["data"][0]
    model_name, model_id = first["id"], first["root"]  # vllm/benchmarks/serve.py's read
    assert model_id == model_name
    cards = {card["id"]: card for card in listing["data"]}
    assert cards["smollm2"]["max_model_len"] == 2048  # its config's engine argument
    assert cards["minilm"]["max_model_len"] == 256  # its max_seq_length
    assert cards["identity"]["max_model_len"] is None
    assert all(card["parent"] is None for card in cards.values())
    one = (await producer.get("/v1/models/smollm2")).json()
    assert (one["root"], one["max_model_len"]) == ("smollm2", 2048)


async def test_a_model_no_name_could_be_is_not_found(producer: httpx.AsyncClient) -> None:
    """OpenAI's SDK raised UnprocessableEntityError (retrieve) or BadRequestError (the others),
    saying a pattern, for a model whose name Conveyor's names exclude (`SmolLM2`, as vLLM's
    served names are written): a model that does not exist is a 404, NotFoundError, as OpenAI's
    API and vLLM's server answer it, whatever its name."""
    sdk = openai_sdk(producer)
    for name in ("SmolLM2", "nope", "x" * 300):
        with pytest.raises(openai.NotFoundError) as retrieved:
            await sdk.models.retrieve(name)
        assert len(retrieved.value.message) < 300, retrieved.value.message
    for name in ("SmolLM2", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model=name, messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            await sdk.completions.create(model=name, prompt="hi")
        with pytest.raises(openai.NotFoundError):
            await sdk.embeddings.create(model=name, input="hi")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": [*MESSAGES, {"role": "assistant", "content": 5}]},
            "messages.1.content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0",  # the part the model cannot read, named whole
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "stop": [""]}, "stop.0"),
        ("/v1/chat/completions", {"messages": MESSAGES, "stop": 5}, "stop"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": 5}, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/embeddings", {"input": 5}, "input"),
    ],
)
async def test_a_refusal_names_the_field_as_sent_not_a_union_branch(
    producer: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    """`param` read `messages.0.content.str` and `prompt.text`, and the message named pydantic's
    branches (`content.list[TextPart].0.type`): fields no client sent."""
    model = "minilm" if path == "/v1/embeddings" else "smollm2"
    response = await producer.post(path, json={"model": model, **body})
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, param), error
    assert error["message"].startswith(f"{param}: "), error
    assert ".str" not in error["message"] and "[" not in error["message"].split(":")[0], error
