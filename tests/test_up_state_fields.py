"""A `<state dir>/stack.json` whose fields are not of the types `conveyor up` writes (edited by
hand, written by another version) is one line naming it, as one cut short is: `"pid": "12"`
ended every command with a traceback from `os.kill`, and a pid of 0, which `os.kill` takes
for the command's own process group, named a stack long gone as running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest

from conveyor.local_stack import STATE_FILE, StackState

WRITTEN = {
    "redis_url": "redis://127.0.0.1:1/0",
    "producer_url": "http://127.0.0.1:1",
    "dev_key_file": "",
    "pid": 1,
}


@pytest.mark.parametrize(
    "edit",
    [
        {"pid": "12"},
        {"pid": None},
        {"pid": 0},
        {"pid": -1},
        {"pid": 2**40},
        {"redis_url": 5},
        {"redis_cluster": "no"},
    ],
)
def test_a_state_file_with_a_field_of_another_type_is_one_line(
    tmp_path: Path, edit: dict[str, Any]
) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps({**WRITTEN, **edit}))
    with pytest.raises(click.ClickException) as refused:
        StackState.read(tmp_path)
    said = refused.value.message
    assert said.startswith(f"cannot read {tmp_path / STATE_FILE} ("), said
    assert next(iter(edit)) in said and "\n" not in said, said
