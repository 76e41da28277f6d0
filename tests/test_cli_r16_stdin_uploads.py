"""`conveyor files upload -` and `conveyor batch submit -` read the JSONL from standard input,
as kubectl's `-f -` and the CLI's own `--input @-` do: `-` was taken for a file's name and
refused, "File '-' does not exist", so a generated batch had to be written to disk first."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from conveyor.cli import main

LINES = b'{"custom_id": "a", "body": {"text": "piped"}}\n'


def test_files_upload_reads_standard_input(base_url: str) -> None:
    result = CliRunner().invoke(main, ["files", "upload", "-", "--url", base_url], input=LINES)

    assert result.exit_code == 0, result.output
    file_id = result.output.strip()
    assert httpx.get(f"{base_url}/v1/files/{file_id}/content").content == LINES


def test_batch_submit_reads_standard_input(base_url: str) -> None:
    args = ["batch", "submit", "-", "--model", "identity", "--url", base_url]

    result = CliRunner().invoke(main, args, input=LINES)

    assert result.exit_code == 0, result.output
    batch = httpx.get(f"{base_url}/v1/batches/{result.output.strip()}").json()
    assert batch["request_counts"]["total"] == 1


def test_batch_submit_wait_from_standard_input_is_refused_before_any_call() -> None:
    """--wait writes its result files beside FILE, and standard input has no such place."""
    args = ["batch", "submit", "-", "--wait", "--url", "http://127.0.0.1:9"]

    result = CliRunner().invoke(main, args, input=LINES)

    assert result.exit_code == 2, result.output
    assert "batch results" in result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize("command", [("files", "upload"), ("batch", "submit")])
def test_an_input_file_that_cannot_be_read_is_one_line(command: tuple[str, ...]) -> None:
    """A file that is there but fails to read (here /proc/self/mem, EIO at its start, as root
    too) ended the command with an OSError traceback."""
    result = CliRunner().invoke(main, [*command, "/proc/self/mem", "--url", "http://127.0.0.1:9"])

    assert result.exit_code == 2, repr(result.exception)
    assert "Invalid value for FILE: cannot read /proc/self/mem: Input/output error" in result.output
