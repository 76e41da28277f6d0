"""`conveyor dlq replay` checks a letter's job parameters as a submit does (in process, on the
session's Valkey): a generate model's `max_tokens_limit` may have been lowered since the job was
submitted, and a batch model takes none; a replay the check would refuse could only fail on the
worker, so it stays a letter, the output saying why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from click.testing import Result

from tests.test_dlq_r11_operator import r  # noqa: F401 (a fixture)
from tests.test_dlq_r19_submit_checks import DLQ, MODEL, _letter, _queued, dlq  # noqa: F401

# the model as the repository has it now: its limit lowered to 64 since its jobs were submitted
GENERATE = "kind: generate\nbackend: vllm\nparameters: {max_tokens_limit: 64}\n"


def test_a_letter_whose_parameters_today_refuses_is_kept_and_says_why(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A replay enqueued a job asking for more tokens than the model's limit now allows: a
    submit of it is refused with a 422, its replay failed on the worker."""
    (tmp_path / "models" / MODEL / "config.yaml").write_text(GENERATE)
    over_id, over = _letter(r, {"inputs": {"prompt": "Hi"}, "parameters": {"max_tokens": 100}})
    _, within = _letter(r, {"inputs": {"prompt": "Hi"}, "parameters": {"max_tokens": 32}})
    ran = dlq("replay", MODEL)
    assert ran.exit_code == 0, ran.output
    assert _queued(r) == [within]
    assert ran.stdout.splitlines()[1:] == [
        f"kept {over} (dead letter {over_id}): parameters_invalid: parameters.max_tokens: at"
        f" most 64 for model {MODEL}:default",
        "replayed 1, kept 1",
    ]
    assert "job parameters" in ran.stderr
    left: Any = r.xrange(DLQ)
    assert [dlq_id for dlq_id, _ in left] == [over_id]


def test_a_batch_models_letter_with_parameters_is_kept(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
) -> None:
    """A batch model's job takes no parameters (its engine ignored them): a submit naming one
    is refused, and so is its letter's replay; one whose parameters are no object (written by
    hand) too, the replay going on past it."""
    letter_id, job = _letter(r, {"inputs": {"text": "ok"}, "parameters": {"normalize": False}})
    odd_id, odd = _letter(r, {"inputs": {"text": "ok"}, "parameters": 5})
    ran = dlq("replay", MODEL)
    assert ran.exit_code == 0, ran.output
    assert _queued(r) == []
    assert ran.stdout.splitlines()[0].startswith(
        f"kept {job} (dead letter {letter_id}): parameters_invalid: parameters.normalize: model"
        f" {MODEL} takes no job parameters"
    )
    assert ran.stdout.splitlines()[1] == (
        f"kept {odd} (dead letter {odd_id}): parameters_invalid: parameters: not a JSON object"
    )
    assert r.xlen(DLQ) == 2
