"""A worker's descendants as /proc lists them (Linux; nothing elsewhere): its engines' own
processes, vLLM's engine core and its executor's workers among them."""

from __future__ import annotations

import contextlib
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, breadth first."""
    found = children(pid)
    for member in found:  # grows as it goes
        found.extend(children(member))
    return found


def children(pid: int) -> list[int]:
    """The children of process `pid`: each is listed under the thread that started it."""
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                found.extend(int(child) for child in (task / "children").read_text().split())
    return found
