"""`conveyor files`: OpenAI's Files API from the shell: uploads that batches are created from
(`conveyor batch from-file`), and an ended batch's output and errors files by their ids."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from conveyor.client.admin_http import utc_time
from conveyor.client.cli_options import connect, connection_options, printable, terminal_safe
from conveyor.file_drafts import write_whole
from shared.file_expiry import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S

# A JSONL file to send, or `-` for standard input (as kubectl's `-f -`): a generated batch
# need not be written to disk first.
JSONL_FILE = click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)


@contextmanager
def jsonl_source(file: Path) -> Iterator[Path]:
    """What `file` names, for the send in this block: the path (its name goes with the
    upload); for `-`, standard input copied to a `batch.jsonl` in a folder of its own, sent
    from disk as a file is, where up to 100 MiB of it was read into memory first. A file that
    is there but fails to read is a usage error naming it: an OSError traceback before."""
    try:
        if str(file) != "-":
            yield file
            return
        with TemporaryDirectory(prefix="conveyor-stdin-") as folder:
            copy = Path(folder) / "batch.jsonl"
            with copy.open("xb") as spool:
                shutil.copyfileobj(sys.stdin.buffer, spool)
            yield copy
    except OSError as exc:
        message = f"cannot read {file}: {exc.strerror or exc}"
        raise click.BadParameter(message, param_hint="FILE") from None


@click.group("files")
def command() -> None:
    """Batch input files, and batches' output and errors files."""


@command.command("upload")
@click.argument("file", type=JSONL_FILE)
@click.option(
    "--expires-after",
    type=click.IntRange(EXPIRES_AFTER_MIN_S, EXPIRES_AFTER_MAX_S),
    default=None,
    metavar="SECONDS",
    help="Keep it this long (OpenAI's expires_after), the server's result TTL at most. "
    "[default: the result TTL]",
)
@connection_options
def upload(file: Path, expires_after: int | None, url: str | None, api_key: str | None) -> None:
    """Upload FILE (JSONL batch lines, purpose batch; `-`: standard input); prints its id."""
    with connect(url, api_key) as client, jsonl_source(file) as source:
        click.echo(client.files.create(source, expires_after=expires_after).id)


@command.command("list")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--after", default=None, help="A file id: list from the one after it.")
@click.option("--order", type=click.Choice(["desc", "asc"]), default="desc", show_default=True)
@connection_options
def list_files(
    limit: int, after: str | None, order: str, url: str | None, api_key: str | None
) -> None:
    """One line per upload of yours: id, bytes, created (UTC), expires (UTC), filename."""
    with connect(url, api_key) as client:
        page = client.files.list(limit, after, order)
    for file in page.data:
        expires = "-" if file.expires_at is None else utc_time(file.expires_at)
        name = printable(file.filename)
        click.echo(f"{file.id}  {file.bytes:>10}  {utc_time(file.created_at)}  {expires}  {name}")
    if page.has_more:  # the order too: without it, the next page went newest first from there
        order_option = " --order asc" if order == "asc" else ""
        click.echo(f"more: --after {page.last_id}{order_option}")


@command.command("get")
@click.argument("file_id")
@connection_options
def get(file_id: str, url: str | None, api_key: str | None) -> None:
    """Print the file object: bytes, times, filename, purpose."""
    with connect(url, api_key) as client:
        click.echo(client.files.get(file_id).model_dump_json(indent=2))


@command.command("content")
@click.argument("file_id")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Write it here (`-`: standard output, as curl's). [default: standard output]",
)
@connection_options
def content(file_id: str, output: Path | None, url: str | None, api_key: str | None) -> None:
    """Its bytes: an upload's, or an ended batch's output or errors JSONL."""
    with connect(url, api_key) as client:
        body = client.files.content(file_id)
    if output is None or str(output) == "-":  # `-` wrote a file of that name
        _refuse_raw_to_terminal(file_id, body)
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()
        return
    try:
        write_whole(output, body)
    except OSError as exc:  # a folder that is not there: a traceback, after the download
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None


def _refuse_raw_to_terminal(file_id: str, body: bytes) -> None:
    """Standard output a terminal: refuse bytes it would act on rather than show (an upload
    holds any bytes; an escape sequence in one could clear the screen or retitle the window),
    as curl refuses binary output there."""
    if not sys.stdout.isatty():
        return
    try:
        safe = terminal_safe(body.decode())
    except UnicodeDecodeError:
        safe = False
    if not safe:
        raise click.UsageError(
            f"{file_id} holds control characters or bytes that are not UTF-8, which a "
            "terminal would act on: write it with -o FILE, or pipe it"
        )


@command.command("delete")
@click.argument("file_id")
@connection_options
def delete(file_id: str, url: str | None, api_key: str | None) -> None:
    """Forget an upload (batches made from it keep their lines)."""
    with connect(url, api_key) as client:
        click.echo(client.files.delete(file_id).model_dump_json(indent=2))
