"""`conveyor files content -o PATH` writes a draft and renames it over PATH: a symlink at PATH
became a regular file (its target kept the old content), and an existing file's mode was lost
(0600 read 0644, the umask's default). It writes through the link now, keeping the mode."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from conveyor.client.types import BatchResults
from conveyor.commands.batch import write_results
from conveyor.file_drafts import write_whole


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _drafts(*folders: Path) -> list[Path]:
    return [draft for folder in folders for draft in folder.glob(".*.part")]


def test_a_symlink_is_written_through_to_its_target_with_its_mode(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    target = tmp_path / "kept" / "results.jsonl"
    target.write_bytes(b"old\n")
    target.chmod(0o600)
    link = tmp_path / "results.jsonl"
    link.symlink_to(Path("kept") / "results.jsonl")  # relative, as `ln -s` is mostly used

    write_whole(link, b"new\n")

    assert link.is_symlink() and link.readlink() == Path("kept") / "results.jsonl"
    assert target.read_bytes() == b"new\n"
    assert _mode(target) == 0o600
    assert _drafts(tmp_path, target.parent) == []


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "secret.bin"
    path.write_bytes(b"old")
    for mode in (0o600, 0o640):
        path.chmod(mode)
        write_whole(path, b"new")
        assert (path.read_bytes(), _mode(path)) == (b"new", mode)


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link, target = tmp_path / "out", tmp_path / "made"
    link.symlink_to(target)
    write_whole(link, b"body")
    assert link.is_symlink() and target.read_bytes() == b"body"


def test_a_loop_of_symlinks_is_an_error_and_stays(tmp_path: Path) -> None:
    """As opening it was (ELOOP): renamed over, a link of the loop became the file."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.symlink_to(second)
    second.symlink_to(first)
    with pytest.raises(OSError, match="symbolic links"):
        write_whole(first, b"body")
    assert first.is_symlink() and second.is_symlink()
    assert _drafts(tmp_path) == []


def test_batch_results_write_through_symlinks_keeping_modes(tmp_path: Path) -> None:
    """`conveyor batch results` drafts both files itself: the same landing and mode."""
    outputs, errors = tmp_path / "kept.jsonl", tmp_path / "errors.jsonl"
    outputs.write_bytes(b"old\n")
    outputs.chmod(0o600)
    link = tmp_path / "out.jsonl"
    link.symlink_to(outputs.name)
    empty = BatchResults(outputs=[], errors=[])

    write_results(empty, link, errors, "batch_x")

    assert link.is_symlink() and outputs.read_bytes() == b""
    assert _mode(outputs) == 0o600 and errors.read_bytes() == b""
    assert _drafts(tmp_path) == []


def test_a_pipe_is_written_in_place(tmp_path: Path) -> None:
    """`-o /dev/stdout` on a pipe: nothing could be renamed over it, no draft made beside it."""
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_whole(fifo, b"body")
    reader.join(5)
    assert read == [b"body"] and stat.S_ISFIFO(fifo.stat().st_mode)
    assert _drafts(tmp_path) == []


def test_setuid_is_not_carried_to_new_content(tmp_path: Path) -> None:
    path = tmp_path / "tool"
    path.write_bytes(b"old")
    path.chmod(0o4755)
    write_whole(path, b"new")
    assert _mode(path) == 0o755
