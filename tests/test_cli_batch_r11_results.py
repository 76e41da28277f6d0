"""`conveyor batch` as a user running a whole batch from the shell uses it: the result files
are written whole or not at all, and a Ctrl-C while `batch submit --wait` follows the batch
leaves it running and says how to fetch its results later."""

from __future__ import annotations

import _thread
import json
import resource
import signal
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner

from conveyor.cli import main
from conveyor.client import Client
from conveyor.client.types import BatchError, BatchResults
from conveyor.commands.batch import result_paths, write_results

QUEUED = {"variant": "canary", "inputs": {"text": "x" * 64}}  # no canary worker: stays queued


def _lines(count: int) -> str:
    return "".join(json.dumps({"custom_id": f"c{i}", "body": QUEUED}) + "\n" for i in range(count))


@contextmanager
def _files_capped_at(size: int) -> Iterator[None]:
    """A write past `size` bytes fails with EFBIG, as one on a full disk fails with ENOSPC: the
    real kernel cutting a write short part-way."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


def test_results_cut_short_leave_the_earlier_files_whole(base_url: str, tmp_path: Path) -> None:
    """A write of the errors file that failed part-way left it truncated (a batch's results to
    anyone reading it) and the output file already replaced by this batch's: now both keep the
    earlier run's content, and no partial file is left beside them."""
    with Client(base_url) as client:
        batch = client.batches.create(_lines(100).encode(), model="identity")
        client.batches.cancel(batch.id)  # 100 errors lines, ~20 KB; no output line
    output, errors = result_paths(tmp_path / "run")
    output.write_text("earlier output\n")
    errors.write_text("earlier errors\n")
    with _files_capped_at(4096):
        cut = CliRunner().invoke(main, ["batch", "results", batch.id, str(tmp_path / "run"),
                                        "--url", base_url])  # fmt: skip
    assert cut.exit_code == 1 and f"cannot write {errors}" in cut.output, cut.output
    assert output.read_text() == "earlier output\n"
    assert errors.read_text() == "earlier errors\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == [errors.name, output.name]

    written = CliRunner().invoke(
        main, ["batch", "results", batch.id, str(tmp_path / "run"), "--url", base_url]
    )
    assert written.exit_code == 0, written.output
    assert output.read_text() == ""
    failed = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [e["custom_id"] for e in failed] == [f"c{i}" for i in range(100)]


def test_results_are_written_line_by_line(tmp_path: Path) -> None:
    """The files were built whole in memory first, twice over (the lines, then their join):
    2.5 times a 2.5 MB errors file at the peak, on top of the results already held."""
    error = {"type": "failed", "message": "m" * 160}
    lines = [{"custom_id": f"c{i}", "line": i + 1, "status": "failed", "error": error}
             for i in range(10_000)]  # fmt: skip
    results = BatchResults(outputs=[], errors=[BatchError.model_validate(e) for e in lines])
    output, errors = result_paths(tmp_path / "big")
    tracemalloc.start()
    try:
        write_results(results, output, errors, "batch_big")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [json.loads(line) for line in errors.read_text().splitlines()] == lines
    assert peak < errors.stat().st_size / 10, (peak, errors.stat().st_size)


def _interrupt_once_followed(client: Client, before: list[str]) -> list[str]:
    """Ctrl-C (SIGINT's KeyboardInterrupt, in the main thread) once the command's batch exists
    and the command has had time to start following it; the new batch's id."""
    while not (made := [b.id for b in client.batches.list(5).data if b.id not in before]):
        time.sleep(0.05)
    time.sleep(0.6)  # past the create's answer: the command polls the batch now
    _thread.interrupt_main()
    return made


def test_ctrl_c_while_following_says_how_to_fetch_the_results(
    base_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "later.jsonl"
    source.write_text(_lines(2))
    with Client(base_url) as client:
        before = [b.id for b in client.batches.list(5).data]
        made: list[str] = []
        interrupter = threading.Thread(
            target=lambda: made.extend(_interrupt_once_followed(client, before))
        )
        interrupter.start()
        args = ["batch", "submit", str(source), "--model", "identity", "--wait"]
        interrupted = CliRunner().invoke(main, [*args, "--url", base_url])
        interrupter.join()
        (batch_id,) = made
        assert client.batches.get(batch_id).status == "in_progress"  # it runs on
        client.batches.cancel(batch_id)
    assert interrupted.exit_code == 130 and "Aborted!" in interrupted.output, interrupted.output
    assert f"conveyor batch results {batch_id} PREFIX" in interrupted.output, interrupted.output
