"""`min_tokens` of a job naming no `max_tokens`, on a variant with a `max_tokens_limit` but no
`default_max_tokens`: such a job runs with 128 tokens at most (UNNAMED_MAX_TOKENS), yet the
submit check measured `min_tokens` against the limit, took 500, and the engine cut it to 128
without a word (vLLM's server would have honoured it or refused it). It is refused now, naming
the max_tokens the job would run with, as for a variant with a default."""

from __future__ import annotations

from typing import Any

import pytest

from shared.job_parameters import ParametersRefused, check_parameters
from shared.model_repository import ModelConfig
from workers.generation.generate_job import generate_request

LIMITED = ModelConfig(
    name="llm", kind="generate", backend="vllm", parameters={"max_tokens_limit": 1024}
)
UNBOUNDED = ModelConfig(name="llm", kind="generate", backend="vllm")


@pytest.mark.parametrize("config", [LIMITED, UNBOUNDED], ids=["limit-only", "neither"])
def test_min_tokens_past_what_a_job_naming_no_max_tokens_runs_with_is_refused(
    config: ModelConfig,
) -> None:
    parameters: dict[str, Any] = {"min_tokens": 500}
    runs_with = generate_request("j", {"parameters": parameters}, config.parameters).max_tokens
    assert runs_with == 128  # what the engine would cut min_tokens to
    with pytest.raises(ParametersRefused) as refused:
        check_parameters(config, "default", parameters)
    assert refused.value.param == "parameters.min_tokens"
    assert "at most the max_tokens a job naming none runs with (128)" in refused.value.message


def test_min_tokens_within_it_or_within_a_named_max_tokens_is_taken() -> None:
    check_parameters(LIMITED, "default", {"min_tokens": 128})
    check_parameters(LIMITED, "default", {"min_tokens": 500, "max_tokens": 500})
