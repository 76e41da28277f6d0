"""`conveyor files content ID -o PATH` writes PATH whole or not at all: it wrote in place, so a
write cut short (here a file size limit, as a full disk) left a truncated PATH that read as the
whole download, over the good copy an earlier download had left. A real producer served over
HTTP from a thread of this process, on the session's Valkey; the CLI run as its own process
under RLIMIT_FSIZE (Python ignores SIGXFSZ, so the write fails with EFBIG)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.stack import free_port
from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from tests.local_http import served_app

KEYS = Keys("batches-r38-download:")
BODY = b"".join(
    b'{"custom_id": "%d", "body": {"inputs": {"x": %d}}}\n' % (i, i) for i in range(2000)
)
LIMIT = len(BODY) // 4  # bytes the CLI's process may write to one file
EARLIER = b'{"an": "earlier, whole download"}\n'


@pytest.fixture(scope="module")
def uploaded(redis_url: str) -> Iterator[tuple[str, str]]:
    """A producer (auth off, its own key prefix) and the id of a file uploaded to it."""
    settings = Settings(redis_url=redis_url, auth="disabled", key_prefix=KEYS.prefix)
    with served_app(create_app(settings), free_port()) as url:
        files = {"file": ("big.jsonl", BODY)}
        upload = httpx.post(f"{url}/v1/files", data={"purpose": "batch"}, files=files)
        assert upload.status_code == 200, upload.text
        yield url, upload.json()["id"]


def test_a_write_cut_short_keeps_the_earlier_file(
    uploaded: tuple[str, str], tmp_path: Path
) -> None:
    url, file_id = uploaded
    path = tmp_path / "out.jsonl"
    path.write_bytes(EARLIER)
    script = (
        "import resource; "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT})); "
        "from conveyor.cli import main; main()"
    )
    args = ["files", "content", file_id, "-o", str(path), "--url", url]
    ran = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stderr
    assert f"cannot write {path}: File too large" in ran.stderr
    assert path.read_bytes() == EARLIER  # not a truncated download
    assert sorted(tmp_path.iterdir()) == [path]  # no draft left behind


def test_a_whole_download_replaces_the_earlier_file(
    uploaded: tuple[str, str], tmp_path: Path
) -> None:
    url, file_id = uploaded
    path = tmp_path / "out.jsonl"
    path.write_bytes(EARLIER)
    result = CliRunner().invoke(main, ["files", "content", file_id, "-o", str(path), "--url", url])
    assert result.exit_code == 0, result.output
    assert path.read_bytes() == BODY
    assert sorted(tmp_path.iterdir()) == [path]
