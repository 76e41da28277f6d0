"""vLLM's own sampling parameters beyond OpenAI's (`top_k`, `min_p`, `repetition_penalty`,
`min_tokens`, `ignore_eos`), as its OpenAI server takes them: refused at submit outside the
bounds vLLM takes (422 naming the field, nothing enqueued), and carried from every route to the
engine's request. A `vllm` model's job naming a parameter no engine maps is refused: the engine
dropped such a parameter (and these five) without a word. No engine runs here
(test_generate_sampling.py runs them on the real model)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from producer_api.errors import ConveyorError
from producer_api.jobs.serving import check_parameters
from producer_api.openai.protocol import ChatCompletionRequest, CompletionRequest
from shared.job_parameters import SamplingParameters
from shared.keys import Keys
from shared.model_repository import ModelConfig, Variant
from workers.generation.generate_job import generate_request

JOBS = "/v1/jobs"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
VLLM_PARAMETERS = {
    "top_k": 1,
    "min_p": 0.5,
    "repetition_penalty": 1.25,
    "min_tokens": 3,
    "ignore_eos": True,
}

# (route, sampling asked for, how the refusal begins). smollm2's default_max_tokens is 256.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (JOBS, {"top_k": -2}, "parameters.top_k: Input should be greater than or equal to -1"),
    (JOBS, {"top_k": 1.0}, "parameters.top_k: Input should be a valid integer"),
    (JOBS, {"min_p": 1.5}, "parameters.min_p: Input should be less than or equal to 1"),
    (JOBS, {"repetition_penalty": 0}, "parameters.repetition_penalty: Input should be greater"),
    (JOBS, {"min_tokens": -1}, "parameters.min_tokens: Input should be greater than or equal"),
    (JOBS, {"min_tokens": 11, "max_tokens": 10}, "parameters.min_tokens: at most max_tokens (10)"),
    (JOBS, {"min_tokens": 257}, "parameters.min_tokens: at most the max_tokens a job naming none"),
    (JOBS, {"ignore_eos": 1}, "parameters.ignore_eos: Input should be a valid boolean"),
    (JOBS, {"top_kk": 1}, "parameters.top_kk: not taken by model smollm2:default (backend vllm"),
    (CHAT, {"top_k": True}, "top_k: Input should be a valid integer"),
    (CHAT, {"min_p": -0.1}, "min_p: Input should be greater than or equal to 0"),
    (CHAT, {"repetition_penalty": -1}, "repetition_penalty: Input should be greater than 0"),
    (CHAT, {"ignore_eos": "true"}, "ignore_eos: Input should be a valid boolean"),
    (CHAT, {"min_tokens": 5, "max_completion_tokens": 4}, "min_tokens: at most max_completion"),
    (COMPLETIONS, {"min_tokens": 17}, "min_tokens: at most max_tokens (16)"),
    (COMPLETIONS, {"top_k": -5}, "top_k: Input should be greater than or equal to -1"),
]


def _body(path: str, sampling: dict[str, Any]) -> dict[str, Any]:
    """A body of `path` asking smollm2 for `sampling`; an OpenAI one streams, so that a body the
    route takes answers at once (no worker serves smollm2 here)."""
    if path == JOBS:
        return {"model": "smollm2", "inputs": {"messages": MESSAGES}, "parameters": sampling}
    asked = {"messages": MESSAGES} if path == CHAT else {"prompt": "Once"}
    return {"model": "smollm2", "stream": True, **asked, **sampling}


@pytest.mark.slow
@pytest.mark.parametrize(("path", "sampling", "says"), REFUSED)
def test_sampling_vllm_would_refuse_or_drop_is_refused_naming_it_and_nothing_is_enqueued(
    base_url: str, stack_redis: redis.Redis, path: str, sampling: dict[str, Any], says: str
) -> None:
    """A 422 from `/v1/jobs`; OpenAI's routes answer as OpenAI's API does, 400."""
    status, kind = (422, "invalid_request") if path == JOBS else (400, "invalid_request_error")
    lane = Keys().queue("smollm2", "default")
    before = stack_redis.xlen(lane)
    with httpx.stream("POST", f"{base_url}{path}", json=_body(path, sampling), timeout=30) as r:
        response = r.read() if r.status_code == status else b""
    assert r.status_code == status, (r.status_code, sampling)
    error = httpx.Response(status, content=response).json()["error"]
    assert error["type"] == kind and error["message"].startswith(says), error
    assert stack_redis.xlen(lane) == before


def test_a_vllm_variant_refuses_an_unknown_parameter_and_a_custom_engines_takes_it() -> None:
    """A `vllm` variant's engine maps `SamplingParameters` alone; a custom engine's variant of
    the same model takes its own parameters as before."""
    config = ModelConfig(
        name="llm",
        kind="generate",
        backend="vllm",
        variants={"default": Variant(), "own": Variant(backend="tests.paced_engine:PacedEngine")},
    )
    check_parameters(config, "own", {"beam_width": 4, "top_k": 1})
    with pytest.raises(ConveyorError) as refused:
        check_parameters(config, "default", {"beam_width": 4, "top_k": 1})
    message = str(refused.value)
    assert message.startswith("parameters.beam_width: not taken by model llm:default"), message
    assert all(name in message for name in SamplingParameters.model_fields), message


@pytest.mark.parametrize("kind", [ChatCompletionRequest, CompletionRequest])
def test_the_openai_routes_put_vllms_parameters_in_the_job(
    kind: type[ChatCompletionRequest | CompletionRequest],
) -> None:
    """They were fields no job carried: OpenAI's SDK sends them in `extra_body`, as to vLLM."""
    asked = {"messages": MESSAGES} if kind is ChatCompletionRequest else {"prompt": "Once"}
    request = kind.model_validate({"model": "smollm2", **asked, **VLLM_PARAMETERS})
    assert request.parameters().items() >= VLLM_PARAMETERS.items()


def test_the_engine_request_carries_every_sampling_parameter_a_job_may_name() -> None:
    """Each parameter the producer takes reaches the request the engine maps, as the job named it
    (a parameter taken at submit and missing here was dropped)."""
    parameters: dict[str, Any] = {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n"],
        "seed": 11,
        "presence_penalty": 0.25,
        "frequency_penalty": -0.5,
        **VLLM_PARAMETERS,
    }
    assert parameters.keys() == SamplingParameters.model_fields.keys()
    SamplingParameters.model_validate(parameters)
    request = generate_request("job", {"inputs": {"prompt": "x"}, "parameters": parameters}, {})
    assert {name: getattr(request, name) for name in parameters} == parameters
    with pytest.raises(TypeError, match="boolean"):
        generate_request("job", {"parameters": {"ignore_eos": "false"}}, {})


def test_a_custom_engines_own_parameters_reach_its_request() -> None:
    """The job kept them, but the request its engine got carried only vLLM's: a custom
    engine never saw its own."""
    parameters = {"beam_width": 4, "style": {"tone": "dry"}, "top_k": 1, "max_tokens": 5}
    request = generate_request("job", {"inputs": {"prompt": "x"}, "parameters": parameters}, {})
    assert request.custom == {"beam_width": 4, "style": {"tone": "dry"}}
    assert (request.top_k, request.max_tokens) == (1, 5)
