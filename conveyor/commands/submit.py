"""`conveyor submit MODEL --input JSON`: submit one job through the SDK, optionally waiting."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from conveyor.client.cli_options import (
    connect,
    connection_options,
    echo_waited,
    json_argument,
    runs_on,
    wait_or_last,
)
from conveyor.finite_float import FiniteFloat

if TYPE_CHECKING:
    from conveyor.client.calls import JobOptions


@click.command("submit")
@click.argument("model")
@click.option(
    "--input",
    "inputs",
    required=True,
    help="The job's inputs: JSON, @file.json, or @- to read standard input.",
)
@click.option("--variant", default=None, help="A variant instead of the weighted split.")
@click.option("--priority", type=click.Choice(["online", "bulk"]), default="online")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the result.")
@click.option(
    "--timeout", default=60.0, show_default=True, type=FiniteFloat(min=0), help="Seconds to wait."
)
@connection_options
def command(
    model: str,
    inputs: str,
    variant: str | None,
    priority: str,
    wait: bool,
    timeout: float,
    url: str | None,
    api_key: str | None,
) -> None:
    """Submit a job to MODEL and print it. With --wait, the job once it ends (or as it stands
    after --timeout seconds); exit 0 if it succeeded, 1 if it ended otherwise, 124 if it had
    not ended, 3 if an error kept it from learning."""
    body = json_argument(inputs, "--input")
    if not isinstance(body, dict):
        raise click.BadParameter("inputs must be a JSON object", param_hint="--input")
    with connect(url, api_key, waits=wait) as client:
        options: JobOptions = {"priority": priority}
        if variant:
            options["variant"] = variant
        job = client.submit(model, body, **options)
        if not wait:
            click.echo(job.model_dump_json(indent=2, exclude_none=True))
            return
        with runs_on(f"job {job.id} was submitted: `conveyor jobs get {job.id}` shows it"):
            job = wait_or_last(client, job.id, timeout)
    echo_waited(job)
