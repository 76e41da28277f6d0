"""The hang guard (tests/hang_guard.py) ends a run whose test outlives its timeout, and says
where it hung; a test that ends in time, or has no time limit, is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

# `{mark}`: the swallowing test's own time limit, if any
SWALLOWS_TEMPLATE = """
import time

import pytest

{mark}
def test_swallows_its_timeout():
    while True:
        try:
            time.sleep(5)
        except BaseException:  # as uvloop did with pytest-timeout's failure
            pass

def test_after():
    pass
"""
SWALLOWS = SWALLOWS_TEMPLATE.format(mark="")
MARKED = SWALLOWS_TEMPLATE.format(mark="@pytest.mark.timeout(1)")


def _pytest(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_guarded.py").write_text(source)
    # Only the plugins the guard works with: pytest-timeout, whose limit it reads, and itself
    # (the installed ones besides, schemathesis and hypothesis among them, took seconds to load)
    command = [sys.executable, "-m", "pytest", "-p", "pytest_timeout", "-p", "tests.hang_guard"]
    command += ["-p", "no:cacheprovider", "-o", "hang_guard_grace_s=1", *options]
    command += ["--rootdir", str(tmp_path), str(tmp_path)]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    # `timeout` bounds this test only if the guard is broken
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _ended_where_it_hung(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 1
    # the mark's or --timeout's 1 s, plus the grace's 1
    assert "Timeout (0:00:02)!" in result.stderr
    assert "in test_swallows_its_timeout" in result.stderr
    assert "test_after" not in result.stdout + result.stderr  # the run ended there


def test_a_test_stuck_past_its_marked_timeout_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    _ended_where_it_hung(_pytest(tmp_path, MARKED))


def test_the_command_lines_timeout_counts_as_pytest_timeout_counts_it(tmp_path: Path) -> None:
    _ended_where_it_hung(_pytest(tmp_path, SWALLOWS, "--timeout=1"))


def test_a_test_that_ends_in_time_is_left_alone(tmp_path: Path) -> None:
    result = _pytest(tmp_path, "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout and "Timeout" not in result.stderr


def test_a_test_with_no_time_limit_is_left_alone(tmp_path: Path) -> None:
    # 2 s past where the guard would end it with the grace (1 s) as its limit
    source = "import time\n\n\ndef test_slow():\n    time.sleep(3)\n"
    result = _pytest(tmp_path, source, "-o", "timeout=0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "Timeout" not in result.stderr
