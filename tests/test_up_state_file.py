"""`<state dir>/stack.json`, through which every CLI command finds the running `conveyor up`:
one it cannot read is one line naming it, and `up` never leaves one half written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.local_stack import STATE_FILE, StackState

CONVEYOR = str(Path(sys.executable).parent / "conveyor")


@pytest.mark.parametrize(
    "content",
    [
        '{"redis_url": "redis://127.0.0.1:6379/0", "produ',  # cut short
        '{"redis_url": "redis://127.0.0.1:6379/0", "port": 1}',  # a field it does not know
    ],
)
def test_a_state_file_it_cannot_read_is_one_line_naming_it(tmp_path: Path, content: str) -> None:
    """Every command read it, those that need no stack too, and each ended with a traceback."""
    (tmp_path / STATE_FILE).write_text(content)
    unset = ("CONVEYOR_URL", "CONVEYOR_REDIS_URL")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["CONVEYOR_STATE_DIR"] = str(tmp_path)
    for args in (("jobs", "get", "0" * 32), ("keys", "list")):
        result = subprocess.run(
            [CONVEYOR, *args], capture_output=True, text=True, timeout=120, env=env, check=False
        )
        assert result.returncode == 1, (args, result.stderr)
        said = f"Error: cannot read {tmp_path / STATE_FILE} ("
        assert result.stderr.startswith(said), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_development_key_file_gone_is_one_line(tmp_path: Path) -> None:
    """Removed while `up` runs: a command that would use it ended with a traceback."""
    gone = tmp_path / "dev-api-key"
    state = StackState("redis://127.0.0.1:1/0", "http://127.0.0.1:1", str(gone), os.getpid())
    state.write(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_URL", "CONVEYOR_API_KEY")}
    env["CONVEYOR_STATE_DIR"] = str(tmp_path)
    result = subprocess.run(
        [CONVEYOR, "jobs", "get", "0" * 32],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: cannot read the development key ("), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


WRITE_CUT_SHORT = """
import resource, signal, sys
from pathlib import Path
from conveyor.local_stack import StackState
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
try:
    StackState("redis://127.0.0.1:2/0", "http://127.0.0.1:2", "", 2).write(Path(sys.argv[1]))
except OSError:
    sys.exit(0)
sys.exit(1)
"""


def test_a_write_cut_short_leaves_the_state_file_as_it_was(tmp_path: Path) -> None:
    """A state file is rewritten whole or not at all: truncated, then written, a command
    reading it meanwhile (or after a write that failed) found it empty or cut short."""
    before = StackState("redis://127.0.0.1:1/0", "http://127.0.0.1:1", "", os.getpid())
    before.write(tmp_path)
    failed = subprocess.run(
        [sys.executable, "-c", WRITE_CUT_SHORT, str(tmp_path)], timeout=60, check=False
    )
    assert failed.returncode == 0, "the write did not fail as it should have"
    assert StackState.read(tmp_path) == before
