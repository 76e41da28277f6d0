"""OpenAI parameters that would change the answer are refused (400 naming the parameter, nothing
enqueued) unless left at their defaults: `response_format` JSON, a `tool_choice` that asks for a
tool call, and logprobs were dropped, and openai-python's `beta.chat.completions.parse`, its
`message.tool_calls[0]` and `choice.logprobs.content` then failed on the plain-text reply."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import redis

from producer_api.openai.protocol import ChatCompletionRequest, CompletionRequest
from shared.keys import Keys

pytestmark = pytest.mark.slow
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {}}}
NAMED_TOOL = {"type": "function", "function": {"name": "lookup"}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
FUNCTIONS = [{"name": "lookup", "parameters": {}}]

# (route, parameters asked for, the parameter the refusal must name)
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"response_format": JSON_SCHEMA}, "response_format"),
    (COMPLETIONS, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    (CHAT, {"tools": TOOLS, "tool_choice": NAMED_TOOL}, "tool_choice"),
    # the deprecated `functions` and `function_call`, which forces a call as a named tool does
    (CHAT, {"functions": FUNCTIONS, "function_call": {"name": "lookup"}}, "function_call"),
    (CHAT, {"logprobs": True}, "logprobs"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs"),
    (COMPLETIONS, {"logprobs": 3}, "logprobs"),
    # OpenAI and vLLM answer the chosen tokens' logprobs for 0: only null leaves them out
    (COMPLETIONS, {"logprobs": 0}, "logprobs"),
    # vLLM's own, which its server acts on: they were ignored, the answer free text
    (CHAT, {"guided_json": {"type": "object"}}, "guided_json"),
    (COMPLETIONS, {"guided_regex": "[0-9]+"}, "guided_regex"),
    (CHAT, {"guided_choice": ["yes", "no"]}, "guided_choice"),
    (CHAT, {"structured_outputs": {"json": {}}}, "structured_outputs"),
    (COMPLETIONS, {"use_beam_search": True}, "use_beam_search"),
    (CHAT, {"stop_token_ids": [2]}, "stop_token_ids"),
    (CHAT, {"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs"),
    (CHAT, {"add_generation_prompt": False}, "add_generation_prompt"),
    (CHAT, {"echo": True}, "echo"),
]

# Each at the default, or a value that asks for the same plain-text answer.
DEFAULTS: list[tuple[str, dict[str, Any]]] = [
    (CHAT, {"response_format": None, "tool_choice": None, "logprobs": None, "top_logprobs": None}),
    (CHAT, {"response_format": {"type": "text"}, "logprobs": False, "top_logprobs": 0}),
    (CHAT, {"tools": TOOLS, "tool_choice": "auto"}),
    (CHAT, {"tools": TOOLS, "tool_choice": "none"}),
    (CHAT, {"tools": TOOLS}),
    (CHAT, {"functions": FUNCTIONS, "function_call": "auto"}),
    (CHAT, {"functions": FUNCTIONS, "function_call": "none"}),
    (COMPLETIONS, {"response_format": {"type": "text"}, "logprobs": None}),
    (CHAT, {"guided_json": None, "use_beam_search": False, "stop_token_ids": []}),
    (CHAT, {"add_generation_prompt": True, "echo": False, "chat_template_kwargs": {}}),
]


def _body(path: str, parameters: dict[str, Any]) -> dict[str, Any]:
    asked = {"messages": MESSAGES} if path == CHAT else {"prompt": "Once"}
    return {"model": "smollm2", "max_tokens": 4, **asked, **parameters}


@pytest.mark.parametrize(("path", "parameters", "named"), REFUSED)
def test_a_parameter_that_changes_the_answer_is_400_and_nothing_is_enqueued(
    base_url: str, stack_redis: redis.Redis, path: str, parameters: dict[str, Any], named: str
) -> None:
    lane = Keys().queue("smollm2", "default")
    before = stack_redis.xlen(lane)
    response = httpx.post(f"{base_url}{path}", json=_body(path, parameters), timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(named), error
    assert stack_redis.xlen(lane) == before


@pytest.mark.parametrize(("path", "parameters", "named"), REFUSED)
def test_a_batch_line_asking_for_it_is_refused_as_the_route_refuses_it(
    base_url: str, stack_redis: redis.Redis, path: str, parameters: dict[str, Any], named: str
) -> None:
    bulk = Keys().bulk_queue("smollm2", "default")
    before = stack_redis.xlen(bulk)
    assert _batch_refusal(base_url, path, parameters).startswith(f"body.{named}")
    assert stack_redis.xlen(bulk) == before


def _batch_refusal(base_url: str, path: str, parameters: dict[str, Any]) -> str:
    """The error of a batch of one line to `path` that must be refused."""
    line = {"custom_id": "a", "url": path, "body": _body(path, parameters)}
    response = httpx.post(f"{base_url}/v1/batches", content=json.dumps(line), timeout=30)
    assert response.status_code == 202, response.text
    batch = response.json()
    assert batch["status"] == "failed" and batch["counts"]["invalid"] == 1, batch
    errors = httpx.get(f"{base_url}/v1/batches/{batch['id']}/errors", timeout=30).json()
    message: str = errors["error"]["message"]
    return message


@pytest.mark.parametrize(("path", "parameters"), DEFAULTS)
def test_the_defaults_are_accepted(
    base_url: str, stack_redis: redis.Redis, path: str, parameters: dict[str, Any]
) -> None:
    """Past validation: an absent variant is the 404 that comes after it, and enqueues nothing
    (no worker serves smollm2 here)."""
    request = ChatCompletionRequest if path == CHAT else CompletionRequest
    request.model_validate(_body(path, parameters))
    lane = Keys().queue("smollm2", "default")
    before = stack_redis.xlen(lane)
    body = {**_body(path, parameters), "variant": "absent"}
    response = httpx.post(f"{base_url}{path}", json=body, timeout=30)
    assert response.status_code == 404, response.text
    assert stack_redis.xlen(lane) == before


def test_a_batch_line_asking_for_echo_is_refused(base_url: str) -> None:
    """A batch line is answered from its job's outputs, which lack the prompt to echo."""
    refusal = _batch_refusal(base_url, COMPLETIONS, {"echo": True})
    assert refusal.startswith("echo:"), refusal
