"""`conveyor dlq replay` of many letters today's input schema refuses (in process, on the
session's Valkey): each kept letter's detail named every way its inputs broke the schema, and the
replay's warning named every kept letter on one line. Both now name the first few and count the
rest exactly, as a submit's 422 does."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import Result

from shared.problem_list import LISTED_PROBLEMS as LISTED  # as a submit lists them
from tests.test_dlq_r11_operator import r  # noqa: F401 (a fixture)
from tests.test_dlq_r19_submit_checks import MODEL, _letter, _queued, dlq  # noqa: F401

# the model as the repository has it now: every input a string
STRINGS = """\
kind: batch
backend: identity
input_schema:
  type: object
  additionalProperties: {type: string}
"""
LETTERS = 150
PROBLEMS = 40  # per letter: each of its inputs is a number


def test_a_replay_of_many_refused_letters_lists_a_few_and_counts_the_rest(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "models" / MODEL / "config.yaml").write_text(STRINGS)
    inputs = {f"k{n:02d}": n for n in range(PROBLEMS)}
    letters = [_letter(r, {"inputs": inputs}) for _ in range(LETTERS)]
    with caplog.at_level(logging.WARNING, logger="shared.dead_letters"):
        ran = dlq("replay", MODEL)
    assert ran.exit_code == 0, ran.output
    assert _queued(r) == []

    kept = ran.stdout.splitlines()
    assert kept[-1] == f"replayed 0, kept {LETTERS}"
    dlq_id, job_id = letters[0]
    head = f"kept {job_id} (dead letter {dlq_id}): input_invalid: "
    assert kept[0].startswith(head)
    said = kept[0].removeprefix(head).split("; ")
    assert said[:2] == [f"inputs['k0{n}']: {n} is not of type \"string\"" for n in (0, 1)]
    assert len(said) == LISTED + 1 and said[-1] == f"and {PROBLEMS - LISTED} more"

    [warning] = [rec.getMessage() for rec in caplog.records if "not replayed" in rec.getMessage()]
    assert f": {LETTERS} dead letters not replayed" in warning
    named = " ".join(dlq_id for dlq_id, _ in letters[:LISTED])
    assert warning.endswith(f"): {named} and {LETTERS - LISTED} more")
