"""Server data the CLI prints as text reaches a terminal: a control character in it (an
upload's filename, an id echoed in an error) is shown escaped, never sent raw, so it cannot
rewrite the screen or the window title; `files content` refuses to send such bytes to one."""

from __future__ import annotations

import os
import pty
import select
from contextlib import redirect_stdout

import click
import httpx
from click.testing import CliRunner

from conveyor.cli import main

ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def test_files_list_escapes_a_filename_s_control_characters(base_url: str) -> None:
    upload = httpx.post(
        f"{base_url}/v1/files",
        data={"purpose": "batch"},
        files={"file": (f"a{ESCAPE}.jsonl", b'{"custom_id": "a", "body": {}}\n')},
    )
    upload.raise_for_status()
    file_id = upload.json()["id"]

    result = CliRunner().invoke(main, ["files", "list", "--url", base_url])

    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith(file_id))
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert line.endswith(r"a\x1b]0;owned%07\x1b[2J.jsonl")  # httpx sent the BEL as %07


def test_an_error_naming_an_id_escapes_its_control_characters(base_url: str) -> None:
    result = CliRunner().invoke(main, ["jobs", "get", f"j{ESCAPE}", "--url", base_url])

    assert result.exit_code == 1
    assert "\x1b" not in result.output, repr(result.output)
    assert r"j\x1b]0;owned\x07\x1b[2J not found" in result.output


def _content_on_a_terminal(base_url: str, body: bytes) -> tuple[int, bytes]:
    """`files content` of an upload of `body` with its standard output a real terminal (a
    pty): its exit code, and what reached the terminal."""
    upload = httpx.post(
        f"{base_url}/v1/files", data={"purpose": "batch"}, files={"file": ("t.jsonl", body)}
    )
    upload.raise_for_status()
    leader, follower = pty.openpty()
    terminal = open(follower, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    try:
        with redirect_stdout(terminal):
            exit_code = main.main(
                ["files", "content", upload.json()["id"], "--url", base_url],
                standalone_mode=False,
            )
    except click.ClickException as refused:
        exit_code = refused.exit_code
    finally:
        terminal.close()
    shown = b""
    while select.select([leader], [], [], 0)[0]:
        try:
            shown += os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: all read
            break
    os.close(leader)
    return exit_code or 0, shown


def test_files_content_refuses_to_send_control_characters_to_a_terminal(base_url: str) -> None:
    exit_code, shown = _content_on_a_terminal(base_url, b'{"a": 1}\x1b]0;owned\x07\n')

    assert exit_code == 2
    assert b"\x1b" not in shown


def test_files_content_of_plain_jsonl_reaches_a_terminal(base_url: str) -> None:
    exit_code, shown = _content_on_a_terminal(base_url, b'{"a": "\\u001b\t1"}\n')

    assert exit_code == 0
    assert b'{"a": "\\u001b\t1"}' in shown
