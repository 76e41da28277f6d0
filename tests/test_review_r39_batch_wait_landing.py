"""`batch submit --wait` refuses result files it cannot write before the batch is created
(`_writable`). Since `write_results` writes through a symlink (its draft beside the target),
the check must look where the draft goes: it looked beside the link, passed, and the batch ran
to its end before the write failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.client.types import BatchResults
from conveyor.commands.batch import write_results
from conveyor.stack import free_port


def _submit_wait(source: Path) -> tuple[int, str]:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a refusal must come first
    result = CliRunner().invoke(
        main, ["batch", "submit", str(source), "--model", "m", "--wait", "--url", url]
    )
    return result.exit_code, result.stderr


@pytest.mark.parametrize("kind", ["into_a_missing_folder", "loop"])
def test_a_symlinked_result_file_that_cannot_be_written_is_refused_first(
    tmp_path: Path, kind: str
) -> None:
    source = tmp_path / "lines.jsonl"
    source.write_text('{"custom_id": "a", "body": {"inputs": {}}}\n')
    link = tmp_path / "lines.output.jsonl"
    if kind == "loop":
        other = tmp_path / "other"
        link.symlink_to(other)
        other.symlink_to(link)
    else:
        link.symlink_to(tmp_path / "missing" / "out.jsonl")
    code, said = _submit_wait(source)
    assert code == 2, said
    assert f"cannot write {link}" in said


def test_two_result_paths_landing_on_one_file_leave_no_draft(tmp_path: Path) -> None:
    """Drafts were kept by where they land: the errors path linked to the outputs file made a
    second draft there, and the first, forgotten, stayed as a hidden `.part` file."""
    outputs, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    outputs.write_bytes(b"old\n")
    errors.symlink_to(outputs.name)

    write_results(BatchResults(outputs=[], errors=[]), outputs, errors, "batch_x")

    assert outputs.read_bytes() == b"" and errors.is_symlink()
    assert list(tmp_path.glob(".*.part")) == []
