"""`conveyor jobs get|cancel ID`: read or cancel one job through the SDK."""

from __future__ import annotations

import click

from conveyor.client.cli_options import connect, connection_options, wait_or_last


@click.group("jobs")
def command() -> None:
    """Jobs on a running producer."""


@command.command("get")
@click.argument("job_id")
@click.option("--wait", "wait_s", default=0.0, help="Seconds to wait for the job to end.")
@connection_options
def get(job_id: str, wait_s: float, url: str | None, api_key: str | None) -> None:
    """Print the job (after waiting up to --wait seconds for it to end)."""
    with connect(url, api_key) as client:
        job = wait_or_last(client, job_id, wait_s) if wait_s > 0 else client.get(job_id)
    click.echo(job.model_dump_json(indent=2, exclude_none=True))


@command.command("cancel")
@click.argument("job_id")
@connection_options
def cancel(job_id: str, url: str | None, api_key: str | None) -> None:
    """Cancel a queued or running job and print it."""
    with connect(url, api_key) as client:
        job = client.cancel(job_id)
    click.echo(job.model_dump_json(indent=2, exclude_none=True))
