"""Sizes a worker cannot act on, and a default its own model refuses, are refused at load in one
line naming the file and the field. Each loaded before: a `max_batch_size` or `max_num_seqs` in
the billions (a worker's read asks Redis for that many entries at once, claimed in one Lua call
that holds the server meanwhile; past 2**63 Redis refuses the COUNT and the worker fails every
read), and a `default_max_tokens` above `max_tokens_limit` (a job that names no max_tokens was
cut short by the engine while its explicit twin was refused, and shared/backlog.py estimated
work by the uncut default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.backlog import backlog_of
from shared.model_repository import MAX_JOBS_PER_READ, ModelConfigError, ModelRepository
from tests.test_config_yaml_types import load_one
from workers.generation.generate_job import generate_request

GENERATE = "kind: generate\nbackend: vllm\n"


def _load(root: Path, text: str) -> ModelRepository:
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(text)
    return ModelRepository.load(root)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"max_batch_size: {MAX_JOBS_PER_READ + 1}\n", "max_batch_size"),
        ("max_batch_size: 100000000000000000000\n", "max_batch_size"),
        ("variants: {default: {max_batch_size: 10000000}}\n", "variants.default.max_batch_size"),
        (f"max_num_seqs: {MAX_JOBS_PER_READ + 1}\n", "max_num_seqs"),
    ],
    ids=["model", "past-int64", "variant", "max_num_seqs"],
)
def test_a_read_size_past_the_bound_is_refused(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, text)
    assert str(refused.value) == (
        f"{tmp_path / 'm' / 'config.yaml'}: {field}: Input should be less than or equal to "
        f"{MAX_JOBS_PER_READ}"
    )


def test_the_bound_itself_loads(tmp_path: Path) -> None:
    text = f"max_batch_size: {MAX_JOBS_PER_READ}\nmax_num_seqs: {MAX_JOBS_PER_READ}\n"
    config = load_one(tmp_path, text).get("m")
    assert config is not None and config.max_batch_size_of("default") == MAX_JOBS_PER_READ


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("parameters: {max_tokens_limit: 128, default_max_tokens: 256}\n", "variant default"),
        (
            "parameters: {default_max_tokens: 256}\n"
            "variants: {default: {}, short: {parameters: {max_tokens_limit: 64}}}\n",
            "variant short",
        ),
    ],
    ids=["model", "variant"],
)
def test_a_default_past_the_limit_is_refused(tmp_path: Path, text: str, where: str) -> None:
    """vLLM refuses a request whose max_tokens is past what it can generate, as the producer
    refuses one past `max_tokens_limit` (422): the model's own default cannot be past it."""
    with pytest.raises(ModelConfigError) as refused:
        _load(tmp_path, GENERATE + text)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'm' / 'config.yaml'}: model m {where}: "), message
    assert "parameters.default_max_tokens" in message and "max_tokens_limit" in message, message
    assert "\n" not in message


def test_a_default_within_the_limit_loads(tmp_path: Path) -> None:
    text = GENERATE + "parameters: {max_tokens_limit: 256, default_max_tokens: 256}\n"
    config = _load(tmp_path, text).get("m")
    assert config is not None and config.variant_parameters("default")["default_max_tokens"] == 256


@pytest.mark.parametrize(
    ("parameters", "tokens"),
    [("{max_tokens_limit: 64}", 64), ("{default_max_tokens: 200}", 200), ("{}", 128)],
    ids=["limit-under-the-fallback", "default", "neither"],
)
def test_an_unmeasured_backlog_counts_the_tokens_a_job_runs_with(
    tmp_path: Path, parameters: str, tokens: int
) -> None:
    """Before any measurement a generate job counts as the max_tokens it runs with when it names
    none: the default, else 128, cut at the limit as the
    engine cuts it; a limit of 64 was estimated at 128 tokens a job, twice the pool's work."""
    config = _load(tmp_path, f"{GENERATE}parameters: {parameters}\n").get("m")
    assert config is not None
    assert backlog_of(config, "default", 3, {}).units_per_job == tokens
    job = generate_request("j", {"inputs": {"prompt": "hi"}}, config.variant_parameters("default"))
    assert job.max_tokens == tokens  # what the worker asks the engine for
