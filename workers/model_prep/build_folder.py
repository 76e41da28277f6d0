"""A preparer's artifact folder while it is built: one build of it at a time, every file
renamed into place whole, and what a killed build left removed by the next."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def build_lock(out_dir: Path) -> Iterator[None]:
    """Held for a whole build of `out_dir` (a lock file beside it, named exactly: a glob took
    another model's), so what an interrupted build left can be removed without hitting the
    files of a build under way."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(f".{out_dir.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def temporary_of(target: Path) -> Path:
    """Where `target` is written before it is renamed into place; named by this process, so a
    killed run's (another process id) is known as a leftover."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def remove_temporaries(folder: Path, names: Iterable[str]) -> None:
    """The temporaries of `names` a killed run left in `folder` (a 90 MB ONNX graph each); to
    be called under `build_lock`."""
    leftover = re.compile("|".join(rf"\.{re.escape(name)}\.\d+\.tmp" for name in names))
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if leftover.fullmatch(path.name):
            path.unlink(missing_ok=True)
