"""One run per state dir, for the commands that start processes into one (`conveyor up`,
`conveyor autoscale`): two runs on one state dir took each other's logs, and the names of
their children (two Valkey servers on one data directory, two workers named alike)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import click


@contextmanager
def state_dir_lock(state_dir: Path, command: str, options: str) -> Iterator[None]:
    """Hold `<state dir>/lock` for the run of `command` (`conveyor up`), which it names with
    its pid there; `options` are how to give it another state dir (`--state-dir`), named in
    the refusal."""
    path = state_dir / "lock"
    with _opened(path, options) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise click.ClickException(
                f"another `{_holder(path) or command}` uses the state dir {state_dir}: stop "
                f"it, or give this one a state dir of its own with {options}"
            ) from None
        lock.truncate(0)  # whom a refused run names (it named its own command, say autoscale)
        lock.write(f"{command}\n{os.getpid()}\n")
        lock.flush()
        yield  # closing the file lets it go


def _opened(path: Path, options: str) -> TextIO:
    """The lock file, its state dir made first; one that cannot be (a file in its place, no
    permission) is one line, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a")
    except OSError as exc:
        raise click.ClickException(
            f"cannot use the state dir {path.parent} ({exc.strerror or exc}): choose another "
            f"with {options}"
        ) from None


def _holder(path: Path) -> str:
    """The command holding the lock, by its first line; empty while it has yet to write it."""
    return path.read_text().partition("\n")[0]
