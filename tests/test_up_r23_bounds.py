"""`conveyor up`'s bounds: a process count past any machine's is a usage error before anything
starts, and a child's log, appended across runs and never rotated, is reported from its end
without reading it whole."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.commands.up import MAX_PROCESSES
from conveyor.stack import TAIL_BYTES, Stack, free_port
from shared.settings import Settings
from tests.conftest import REPO_ROOT

LOG_GIB = 8  # a sparse log: no disk, but more than the reader's address space
MEMORY_GIB = 2  # the reader's address space: its imports take well under it


@pytest.mark.parametrize("option", ["--producers", "--workers-per-model"])
def test_a_process_count_past_the_bound_is_a_usage_error(
    tmp_path: Path, settings_env: Callable[..., None], option: str
) -> None:
    """`--producers 80000` forked until the machine ran out of pids or memory. A Redis that
    does not answer: were the count let through, `up` would stop there with another error.
    In-process, as the `conveyor` entry point runs `main` (a usage error is exit 2)."""
    settings_env(CONVEYOR_REDIS_URL="redis://127.0.0.1:1/0")
    args = [option, str(MAX_PROCESSES + 1), "--port", str(free_port()), "--state-dir"]
    result = CliRunner().invoke(main, ["up", *args, str(tmp_path)])
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert f"Invalid value for '{option}'" in result.stderr, result.stderr
    assert f"1<=x<={MAX_PROCESSES}" in result.stderr, result.stderr


# Run with an address space smaller than the log: reading it whole is a MemoryError.
TAIL_OF_A_HUGE_LOG = f"""
import resource, sys
from pathlib import Path
from conveyor.stack import Stack
from shared.settings import Settings
limit = {MEMORY_GIB} << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
print("\\n".join(Stack(Settings(), Path(sys.argv[1])).log_tail("worker", 2)))
"""


def test_the_tail_of_a_log_larger_than_memory_is_its_last_lines(tmp_path: Path) -> None:
    with (tmp_path / "worker.log").open("wb") as log:
        log.truncate(LOG_GIB << 30)
        log.seek(0, os.SEEK_END)
        log.write(b"\nstarting\nengine failed: out of luck\nexited\n")
    result = subprocess.run(
        [sys.executable, "-c", TAIL_OF_A_HUGE_LOG, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["engine failed: out of luck", "exited"]


def test_a_tail_longer_than_the_window_starts_at_a_whole_line(tmp_path: Path) -> None:
    """Past the window's start, the line cut by it is left out rather than shown half."""
    line = "x" * 99
    count = TAIL_BYTES // 100 + 10  # more lines than the window holds
    (tmp_path / "producer.log").write_text("".join(f"{line}\n" for _ in range(count)))
    tail = Stack(Settings(), tmp_path).log_tail("producer", count)
    assert tail and all(entry == line for entry in tail)
    assert len(tail) == TAIL_BYTES // 100
