"""One run per state dir, for the commands that start processes into one (`conveyor up`,
`conveyor autoscale`): two runs on one state dir took each other's logs, and the names of
their children (two Valkey servers on one data directory, two workers named alike)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click


@contextmanager
def state_dir_lock(state_dir: Path, command: str, options: str) -> Iterator[None]:
    """Hold `<state dir>/lock` for the run of `command` (`conveyor up`); `options` are how to
    give it another state dir (`--state-dir`), named in the refusal."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise click.ClickException(
                f"another `{command}` uses the state dir {state_dir}: stop it, or give this "
                f"one a state dir of its own with {options}"
            ) from None
        yield  # closing the file lets it go
