"""The engine reaper ends only the worker's own processes: a pid it is handed that belongs to
another process by the time it looks (the engine's exited and its number reused) is left be."""

from __future__ import annotations

import subprocess

from workers.runtime.engine_reaper import EngineReaper


def test_a_process_not_the_workers_child_is_never_signalled() -> None:
    # a grandchild, its parent alive: no child of this (the worker's) process
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout is not None
    stranger = int(shell.stdout.readline())
    try:
        reaper = EngineReaper([stranger])
        assert reaper._helper.stdin is not None
        reaper._helper.stdin.close()  # the worker's end closed without a word: as its death
        reaper._helper.wait(timeout=5)
        assert _state(stranger) not in ("Z", "X"), "the reaper signalled a process not the worker's"
    finally:
        subprocess.run(["kill", "-9", str(stranger)], check=False)
        shell.wait(timeout=5)
        shell.stdout.close()


def _state(pid: int) -> str:
    """The process's state letter; X (dead) once it is gone, reaped by whoever adopted it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"
