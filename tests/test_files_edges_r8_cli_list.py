"""`conveyor files list` on the shared stack: `--order asc` pages on by the command it prints
when more follow (it printed `--after ID` alone, and that command listed newest first, the
default, from ID: the files before it again rather than the ones after it); and each file's
created and expires columns are UTC dates and times (the time of day alone made a file kept a
day look as if it expired the moment it was uploaded)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from click.testing import CliRunner

from conveyor.cli import main

LINE = b'{"custom_id": "a", "body": {}}\n'


def _upload(base_url: str, name: str) -> dict[str, int | str]:
    files = {"file": (name, LINE)}
    uploaded = httpx.post(f"{base_url}/v1/files", data={"purpose": "batch"}, files=files)
    uploaded.raise_for_status()
    answer: dict[str, int | str] = uploaded.json()
    return answer


def _listed(base_url: str, *args: str) -> list[str]:
    result = CliRunner().invoke(main, ["files", "list", *args, "--url", base_url])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_the_next_page_an_oldest_first_listing_prints_goes_on_oldest_first(
    base_url: str,
) -> None:
    for name in ("first.jsonl", "second.jsonl"):
        _upload(base_url, name)

    first, more = _listed(base_url, "--order", "asc", "--limit", "1")
    assert more.startswith("more: "), more
    following = _listed(base_url, *more.removeprefix("more: ").split(), "--limit", "1")

    oldest = _listed(base_url, "--order", "asc", "--limit", "2")
    assert [first, *following[:1]] == oldest[:2]


def test_a_listed_files_times_say_the_day(base_url: str) -> None:
    uploaded = _upload(base_url, "dated.jsonl")

    line = next(line for line in _listed(base_url) if line.startswith(str(uploaded["id"])))

    _, _, created, expires, _ = line.split()
    iso = [
        datetime.fromtimestamp(int(uploaded[field]), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for field in ("created_at", "expires_at")
    ]
    assert [created, expires] == iso
