"""A `stack.json` left by a `conveyor up` killed with -9 names a pid that, after a restart of
the machine or container, another process may have: the CLI took that stack as running and
used its Redis. `up` writes its process's start (clock ticks since boot) and the boot's id,
and the reader holds the live process to them; a file without them (an older `up`) keeps
being believed while its pid lives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conveyor.local_stack import STATE_FILE, StackState, process_start

REDIS, PRODUCER = "redis://127.0.0.1:1/0", "http://127.0.0.1:1"


def _write(state_dir: Path, **fields: object) -> None:
    written = {"redis_url": REDIS, "producer_url": PRODUCER, "dev_key_file": "", **fields}
    (state_dir / STATE_FILE).write_text(json.dumps(written))


def _mine() -> tuple[int, str]:
    start = process_start(os.getpid())
    assert start is not None  # Linux: /proc is there
    return start


def test_up_writes_its_start_and_the_reader_finds_it_running(tmp_path: Path) -> None:
    written = StackState.for_this_process(REDIS, PRODUCER, "", cluster=False)
    written.write(tmp_path)
    assert (written.pid, (written.start_ticks, written.boot_id)) == (os.getpid(), _mine())
    assert StackState.read(tmp_path) == written


@pytest.mark.parametrize("other", ["start", "boot"])
def test_a_pid_another_process_now_has_is_no_stack(tmp_path: Path, other: str) -> None:
    """The pid lives, but its process started at another time, or in another boot."""
    ticks, boot_id = _mine()
    if other == "start":
        ticks += 1
    else:
        boot_id = "00000000-0000-0000-0000-000000000000"
    _write(tmp_path, pid=os.getpid(), start_ticks=ticks, boot_id=boot_id)
    assert StackState.read(tmp_path) is None


def test_a_state_file_of_an_older_up_is_believed_while_its_pid_lives(tmp_path: Path) -> None:
    _write(tmp_path, pid=os.getpid())
    state = StackState.read(tmp_path)
    assert state is not None and state.redis_url == REDIS


def test_a_command_name_with_spaces_and_parentheses_is_read_past(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/<pid>/stat's second field is the command's name in parentheses, which may hold
    both: the fields after it are counted from its last `)`."""
    (tmp_path / "42").mkdir()
    rest = " ".join(str(n) for n in range(3, 22))  # fields 3 to 21; 22 is the start
    (tmp_path / "42" / "stat").write_text(f"42 (a) b (c)) {rest} 987654 23 24\n")
    (tmp_path / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "random" / "boot_id").write_text("boot-1\n")
    monkeypatch.setattr("conveyor.local_stack.PROC", tmp_path)
    assert process_start(42) == (987654, "boot-1")
    assert process_start(43) is None  # gone, or no /proc at all
