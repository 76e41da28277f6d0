"""The CLI's whole-file writes have one owner (`write_all_whole`): `conveyor batch results` and
`batch submit --wait` drafted their two files themselves and renamed them over a FIFO (its
reader never heard a line, the FIFO became a regular file), and `files content -o
/dev/stdout` on a pipe looked where its /proc link leads (`pipe:[N]`, no path) and failed."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.client.types import BatchOutput, BatchResults
from conveyor.commands.batch import result_paths, write_results
from conveyor.file_drafts import NotWritten, write_all_whole, write_whole

LINE = {"id": "job_1", "custom_id": "a", "line": 1, "outputs": [1.5]}


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


def test_batch_results_to_a_fifo_are_written_into_it(tmp_path: Path) -> None:
    output, errors = result_paths(tmp_path / "run")
    os.mkfifo(output)
    reader = os.open(output, os.O_RDONLY | os.O_NONBLOCK)  # a reader there: no open blocks
    try:
        results = BatchResults(outputs=[BatchOutput.model_validate(LINE)], errors=[])
        write_results(results, output, errors, "batch_x")
        heard = os.read(reader, 65_536)
    finally:
        os.close(reader)
    # before: the FIFO renamed over, a regular file, and its reader heard nothing (b"")
    assert [json.loads(line) for line in heard.splitlines()] == [LINE]
    assert stat.S_ISFIFO(output.stat().st_mode)
    assert errors.read_bytes() == b""
    assert list(tmp_path.glob(".*.part")) == []


def test_a_link_to_a_pipe_is_written_into_the_pipe(pipe: tuple[int, int]) -> None:
    """`-o /dev/stdout` with standard output a pipe: /dev/stdout leads to /proc/self/fd/1,
    which /proc shows linked to `pipe:[N]`, a path that is not there."""
    read, write = pipe
    write_whole(Path(f"/proc/self/fd/{write}"), b"body\n")
    assert os.read(read, 100) == b"body\n"


def test_a_failed_draft_leaves_the_pipe_unwritten(tmp_path: Path, pipe: tuple[int, int]) -> None:
    """A pipe cannot take back what it was given: it is written once every draft is."""
    read, write = pipe
    os.set_blocking(read, False)
    missing = tmp_path / "missing" / "errors.jsonl"
    with pytest.raises(NotWritten) as raised:
        write_all_whole([(Path(f"/proc/self/fd/{write}"), [b"body\n"]), (missing, [b"x"])])
    assert raised.value.path == missing
    with pytest.raises(BlockingIOError):
        os.read(read, 100)
