"""Every OpenAI or vLLM field Conveyor serves at a few values only (null among them) refuses any
other in words that say what is taken: a completion's `logprobs: 5` read "Input should be None"
(as if of a wrong type), a chat's `echo: true` "Input should be False" (Python's spelling), a
`bad_words` list "List should have at most 0 items after validation". Each stays a 400
`invalid_request_error` naming the field (`param`), and what is taken stays taken. The fields
are read off the request models' JSON schemas, so a field added later is covered. A producer
served in-process over a real Valkey; nothing reaches a worker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from producer_api.app import create_app
from producer_api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    StreamOptions,
)
from shared.settings import Settings
from tests.app_client import app_client

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
ROUTES: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
    "/v1/chat/completions": (ChatCompletionRequest, CHAT),
    "/v1/completions": (CompletionRequest, {"model": "smollm2", "prompt": "hi"}),
    "/v1/embeddings": (EmbeddingRequest, {"model": "minilm", "input": "hi"}),
}
# a nested model's fields, sent inside the body that takes it
NESTED: dict[str, tuple[type[BaseModel], str, dict[str, Any]]] = {
    "stream_options": (StreamOptions, "/v1/chat/completions", {**CHAT, "stream": True}),
}


def _taken(schema: dict[str, Any]) -> list[Any] | None:
    """The values besides null a field takes where it takes null and a few others only (its
    consts and enums, an empty list or object); None for any other field."""
    options = schema.get("anyOf", [schema])
    if not any(option.get("type") == "null" for option in options):
        return None
    taken: list[Any] = []
    for option in options:
        if "const" in option or "enum" in option:
            taken += option["enum"] if "enum" in option else [option["const"]]
        elif option.get("maxItems") == 0 or option.get("maxProperties") == 0:
            taken.append([] if option["type"] == "array" else {})
        elif option.get("type") != "null":
            return None
    return taken


def _refused(taken: list[Any]) -> Any:
    """A value of the field's own type that it does not take."""
    match taken:
        case [bool(value)]:
            return not value
        case [int(value)]:
            return value - 1 if value > 0 else value + 1  # n's 2 has its own refusal
        case [[]]:
            return [1]
        case [{}]:
            return {"a": 1}
        case []:
            return 5
    return "unserved"


def _cases() -> list[Any]:
    """(route, the body without the field, its `param`, what it takes), for each such field."""
    cases = []
    served = [(path, model, body, "") for path, (model, body) in ROUTES.items()]
    served += [(path, model, body, f"{name}.") for name, (model, path, body) in NESTED.items()]
    for path, model, body, prefix in served:
        for name, schema in model.model_json_schema()["properties"].items():
            if (taken := _taken(schema)) is not None:
                case = (path, body, prefix + name, taken)
                cases.append(
                    pytest.param(
                        *case, id=f"{path.removeprefix('/v1/').replace('/', '-')}-{prefix}{name}"
                    )
                )
    return cases


def _sent(body: dict[str, Any], param: str, value: Any) -> dict[str, Any]:
    """`body` with `param` (dotted: a nested field) set to `value`."""
    head, _, rest = param.partition(".")
    return {**body, head: {rest: value}} if rest else {**body, head: value}


CASES = _cases()


@pytest.fixture(scope="module")
async def producer(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_url, auth="disabled", instance_id="openai-r39-worded")
    async with app_client(create_app(settings)) as client:
        yield client


def test_the_fields_are_found() -> None:
    """The schema reading finds the fields this was written for, vLLM's and OpenAI's."""
    found = {(path, param) for path, _, param, _ in (case.values for case in CASES)}
    for path, param in [
        ("/v1/completions", "logprobs"),
        ("/v1/completions", "best_of"),
        ("/v1/completions", "suffix"),
        ("/v1/chat/completions", "top_logprobs"),
        ("/v1/chat/completions", "priority"),
        ("/v1/chat/completions", "bad_words"),
        ("/v1/chat/completions", "logit_bias"),
        ("/v1/chat/completions", "stream_options.continuous_usage_stats"),
        ("/v1/embeddings", "normalize"),
    ]:
        assert (path, param) in found


@pytest.mark.parametrize(("path", "body", "param", "taken"), CASES)
async def test_a_value_not_taken_is_refused_saying_what_is(
    producer: httpx.AsyncClient, path: str, body: dict[str, Any], param: str, taken: list[Any]
) -> None:
    answer = await producer.post(path, json=_sent(body, param, _refused(taken)))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    message = error["message"]
    head, tail = f"{param}: not supported: send ", " or omit it"
    assert message.startswith(head) and message.endswith(tail), message
    named = [json.loads(value) for value in message[len(head) : -len(tail)].split(", ")]
    # every value named is taken; every one taken is named, but an empty string (a suffix of
    # ""), which asks for what null does
    assert all(value in [*taken, None] for value in named), (named, taken)
    assert all(value in named for value in taken if value != ""), (named, taken)


@pytest.mark.parametrize(("path", "body", "param", "taken"), CASES)
def test_what_is_taken_stays_taken(
    path: str, body: dict[str, Any], param: str, taken: list[Any]
) -> None:
    """As before: each value taken, and null (vLLM's clients send their defaults)."""
    model = ROUTES[path][0]
    for value in [*taken, None]:
        model.model_validate(_sent(body, param, value))
