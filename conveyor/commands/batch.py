"""`conveyor batch submit FILE.jsonl --model M [--wait]`: run a JSONL batch on the bulk lane
through the SDK, with a live progress bar (rate, ETA), then write `FILE.output.jsonl` and
`FILE.errors.jsonl` beside it. Also `get`, `cancel` and `results` for a batch id."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from conveyor.client.cli_options import (
    NOT_SUCCEEDED,
    OutcomeUnknown,
    connect,
    connection_options,
    runs_on,
)
from conveyor.client.option_pairs import option_pairs
from conveyor.commands.files import JSONL_FILE, jsonl_source
from conveyor.file_drafts import NotWritten, landing_of, write_all_whole
from shared.file_expiry import EXPIRES_AFTER_MAX_S, EXPIRES_AFTER_MIN_S

if TYPE_CHECKING:
    from pydantic import BaseModel

    from conveyor.client.sync_client import Client
    from conveyor.client.types import Batch, BatchResults

F = TypeVar("F", bound=Callable[..., Any])


def result_paths(source: Path) -> tuple[Path, Path]:
    """`data.jsonl` → `data.output.jsonl`, `data.errors.jsonl` (beside the input)."""
    stem = source.with_suffix("") if source.suffix == ".jsonl" else source
    return stem.parent / f"{stem.name}.output.jsonl", stem.parent / f"{stem.name}.errors.jsonl"


def write_results(
    results: BatchResults,
    output: Path,
    errors: Path,
    batch_id: str,
    failure: type[click.ClickException] = click.ClickException,
) -> None:
    """Both files' lines as the server served them (what was absent stays absent, a null a
    null: OpenAI's errors lines carry `id` and `response` null for a line that never ran). A
    file that cannot be written is `failure`, naming the command that writes them elsewhere:
    it was an OSError traceback.

    Both are written whole (`write_all_whole`): a write cut short (a full disk, Ctrl-C) left a
    truncated file that read as the batch's whole results, beside the other file of an earlier
    run. A path that is a pipe (a FIFO, a link to /dev/stdout) is written in place: renamed
    over, the FIFO became a regular file and its reader never heard a line."""
    try:
        write_all_whole([(output, _jsonl(results.outputs)), (errors, _jsonl(results.errors))])
    except NotWritten as exc:
        raise failure(
            f"cannot write {exc.path}: {exc.strerror}; `conveyor batch results "
            f"{batch_id} PREFIX` writes them elsewhere"
        ) from None


def _jsonl(lines: Iterable[BaseModel]) -> Iterator[bytes]:
    import orjson  # only the commands that write results need it, not `--help`

    return (orjson.dumps(line.model_dump(exclude_unset=True)) + b"\n" for line in lines)


def _writable(*paths: Path) -> None:
    """Refused before the batch is created: a result file that cannot be written (a folder of
    its name, a folder without write access, where `write_results` makes it) was found only
    after the whole batch had run. Looked at where it lands (`landing_of`: a symlink's target,
    beside which its draft is made), not beside the link; a loop of links cannot be written."""
    for path in paths:
        try:
            landing = landing_of(path)
        except OSError:  # ELOOP
            landing = None
        if landing is None or landing.is_dir() or not os.access(landing.parent, os.W_OK):
            message = f"cannot write {path}, where --wait writes its results"
            raise click.BadParameter(message, param_hint="FILE")


def follow(client: Client, batch: Batch) -> Batch:
    """Wait for the batch with a progress bar of finished lines (succeeded + failed)."""
    from conveyor.batch_progress import progress_bar  # rich: only a wait draws it, not `--help`

    with progress_bar() as bar:
        task = bar.add_task(batch.id, total=batch.counts.total, failed=0)

        def update(seen: Batch) -> None:
            counts = seen.counts
            bar.update(
                task, completed=counts.finished, failed=counts.failed, description=seen.status
            )

        return client.batches.wait(batch.id, progress=update, poll_s=0.5)


@click.group("batch")
def command() -> None:
    """JSONL batches on the bulk lane."""


def _create_options(create: F) -> F:
    """The options of a batch's create, from lines or from an upload."""
    options = (
        click.option("--model", default=None, help="Model for lines whose body names none."),
        click.option(
            "--completion-window", default="24h", show_default=True, help="e.g. 30m, 24h."
        ),
        click.option("--webhook", default=None, help="URL POSTed a signed event when it ends."),
        click.option(
            "--output-expires-after",
            type=click.IntRange(EXPIRES_AFTER_MIN_S, EXPIRES_AFTER_MAX_S),
            default=None,
            metavar="SECONDS",
            help="Keep the output and error files this long from the batch's end (OpenAI's "
            "output_expires_after), the server's result TTL at most. [default: the result TTL]",
        ),
        click.option(
            "--metadata",
            "metadata",
            multiple=True,
            callback=lambda _ctx, _param, values: option_pairs(
                values, "--metadata", "KEY=VALUE", str
            ),
            metavar="KEY=VALUE",
            help="Kept and shown with the batch, as OpenAI's metadata (repeat; 16 at most).",
        ),
    )
    for option in reversed(options):
        create = option(create)
    return create


def _left_running(batch_id: str) -> str:
    """What a follow cut short says: the batch runs on, so a Ctrl-C must not lose its results,
    which the command writes only once it ended (it named only `get`, which shows no line)."""
    return (
        f"batch {batch_id} was created and runs on: `conveyor batch get {batch_id}` shows it, "
        f"`conveyor batch results {batch_id} PREFIX` writes its results once it ended"
    )


@command.command("submit")
@click.argument("file", type=JSONL_FILE)
@_create_options
@click.option("--wait", is_flag=True, help="Follow progress, then write the result files.")
@connection_options
def submit(
    file: Path,
    model: str | None,
    completion_window: str,
    webhook: str | None,
    output_expires_after: int | None,
    metadata: dict[str, str],
    wait: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Submit FILE (one `{"custom_id", "body": {...}}` per line; `-`: standard input, without
    --wait); prints the batch id. With --wait, writes X.output.jsonl and X.errors.jsonl beside
    FILE (X: its name less `.jsonl`), replacing any there, once it ends, and exits 0 if it
    completed (its failed lines are in the errors file), 1 if it ended otherwise (cancelled,
    expired, failed), 2 before anything is sent if those files cannot be written, 3 if an
    error kept it from learning how the batch ended."""
    output, errors = result_paths(file)
    if wait and str(file) == "-":  # the results go beside FILE, and standard input has no folder
        raise click.BadParameter(
            "--wait writes its results beside FILE, and standard input has none: submit "
            "without --wait, then `conveyor batch results ID PREFIX` writes them",
            param_hint="FILE",
        )
    if wait:
        _writable(output, errors)
    with connect(url, api_key, waits=wait) as client:
        with jsonl_source(file) as source:
            batch = client.batches.create(
                source,
                model,
                completion_window,
                webhook,
                output_expires_after=output_expires_after,
                metadata=metadata,
            )
        if not wait:
            click.echo(batch.id)
            return
        with runs_on(_left_running(batch.id)):
            batch = follow(client, batch)
        with runs_on(f"`conveyor batch results {batch.id} PREFIX` writes its results"):
            results = client.batches.results(batch.id)
    write_results(results, output, errors, batch.id, OutcomeUnknown)
    counts = batch.counts
    click.echo(f"{batch.id} {batch.status}: {counts.succeeded} succeeded, {counts.failed} failed")
    click.echo(f"{output}\n{errors}")
    if batch.status != "completed":
        raise click.exceptions.Exit(NOT_SUCCEEDED)


@command.command("from-file")
@click.argument("file_id")
@click.option(
    "--endpoint",
    default="/v1/jobs",
    show_default=True,
    help="The url every line names (/v1/jobs, /v1/embeddings, /v1/chat/completions or "
    "/v1/completions; the server refuses another).",
)
@_create_options
@connection_options
def from_file(
    file_id: str,
    endpoint: str,
    model: str | None,
    completion_window: str,
    webhook: str | None,
    output_expires_after: int | None,
    metadata: dict[str, str],
    url: str | None,
    api_key: str | None,
) -> None:
    """Create a batch from FILE_ID (`conveyor files upload`), as OpenAI's create does: one
    upload may feed many batches. Prints the batch id."""
    with connect(url, api_key) as client:
        batch = client.batches.create_from_file(
            file_id,
            endpoint,
            completion_window,
            model=model,
            webhook=webhook,
            metadata=metadata or None,
            output_expires_after=output_expires_after,
        )
    click.echo(batch.id)


@command.command("get")
@click.argument("batch_id")
@connection_options
def get(batch_id: str, url: str | None, api_key: str | None) -> None:
    """Print the batch: status, counts, timestamps."""
    with connect(url, api_key) as client:
        click.echo(client.batches.get(batch_id).model_dump_json(indent=2))


@command.command("list")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--after", default=None, help="A batch id: list from the one after it.")
@connection_options
def list_batches(limit: int, after: str | None, url: str | None, api_key: str | None) -> None:
    """One line per batch of yours, newest first: id, status, succeeded/failed of total, url."""
    with connect(url, api_key) as client:
        page = client.batches.list(limit, after)
    for batch in page.data:
        counts = batch.counts
        done = f"{counts.succeeded}/{counts.failed} of {counts.total}"
        click.echo(f"{batch.id}  {batch.status:<11} {done:<18} {batch.endpoint}")
    if page.has_more:
        click.echo(f"more: --after {page.last_id}")


@command.command("cancel")
@click.argument("batch_id")
@connection_options
def cancel(batch_id: str, url: str | None, api_key: str | None) -> None:
    """Cancel what is left of a batch."""
    with connect(url, api_key) as client:
        click.echo(client.batches.cancel(batch_id).model_dump_json(indent=2))


@command.command("results")
@click.argument("batch_id")
@click.argument("prefix", type=click.Path(dir_okay=False, path_type=Path))
@connection_options
def results(batch_id: str, prefix: Path, url: str | None, api_key: str | None) -> None:
    """Write PREFIX.output.jsonl and PREFIX.errors.jsonl of an ended batch, replacing any
    there."""
    output, errors = result_paths(prefix)
    with connect(url, api_key) as client:
        fetched = client.batches.results(batch_id)
    write_results(fetched, output, errors, batch_id)
    click.echo(f"{output}\n{errors}")
