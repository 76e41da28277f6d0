"""A test still running well after its pytest-timeout limit (a loop that swallowed the timeout's
failure, a teardown that hangs after it) dumps every thread's stack to the terminal and ends
its process (under `make test`, its xdist worker: the test fails as crashed and a new worker
goes on). Without this, one such hang ran on silently until CI's own limit killed the whole
job, and its log said nothing of where."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator
from typing import TextIO

import pytest

TERMINAL = pytest.StashKey[TextIO]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "hang_guard_grace_s",
        "seconds past a test's timeout before its stacks are dumped and the run ends",
        default="180",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The terminal itself: while a test runs, capture points fd 2 at a temporary file.
    config.stash[TERMINAL] = os.fdopen(os.dup(sys.stderr.fileno()), "w")


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[TERMINAL].close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    timeout = _timeout_s(item)
    if timeout <= 0:  # no limit set: nothing to be past
        return (yield)
    limit = timeout + float(item.config.getini("hang_guard_grace_s"))
    faulthandler.dump_traceback_later(limit, exit=True, file=item.config.stash[TERMINAL])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _timeout_s(item: pytest.Item) -> float:
    """The test's pytest-timeout limit, found as pytest-timeout finds it: its `timeout` mark,
    else `--timeout`, else the ini's."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    given = item.config.getoption("timeout", default=None)
    return float(given if given is not None else item.config.getini("timeout") or 0)
