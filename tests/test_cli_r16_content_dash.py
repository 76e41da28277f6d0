"""`conveyor files content ID -o -` writes to standard output, as curl's and wget's `-o -`
do: it wrote a file named `-` in the working folder and printed nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from conveyor.cli import main

BODY = b'{"custom_id": "a", "body": {}}\n'


def test_output_dash_is_standard_output(
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload = httpx.post(
        f"{base_url}/v1/files", data={"purpose": "batch"}, files={"file": ("d.jsonl", BODY)}
    )
    upload.raise_for_status()
    monkeypatch.chdir(tmp_path)
    args = ["files", "content", upload.json()["id"], "-o", "-", "--url", base_url]

    result = CliRunner().invoke(main, args)

    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == BODY
    assert not (tmp_path / "-").exists()
