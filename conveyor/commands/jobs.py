"""`conveyor jobs get|wait|cancel ID`: read, follow or cancel one job through the SDK."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from conveyor.client.cli_options import connect, connection_options, echo_waited, wait_or_last
from conveyor.finite_float import FiniteFloat

if TYPE_CHECKING:
    from conveyor.client import Event


@click.group("jobs")
def command() -> None:
    """Jobs on a running producer."""


@command.command("get")
@click.argument("job_id")
@click.option(
    "--wait",
    "wait_s",
    default=0.0,
    type=FiniteFloat(min=0),
    help="Seconds to wait for the job to end.",
)
@click.option("--attempts", is_flag=True, help="With every attempt: worker, times, outcome.")
@connection_options
def get(job_id: str, wait_s: float, attempts: bool, url: str | None, api_key: str | None) -> None:
    """Print the job. With --wait, after waiting up to that many seconds for it to end, and
    exit 0 if it succeeded, 1 if it ended otherwise, 124 if it had not ended, 3 if an error
    kept it from learning."""
    with connect(url, api_key, waits=wait_s > 0) as client:
        if wait_s <= 0:
            click.echo(client.get(job_id, attempts).model_dump_json(indent=2, exclude_none=True))
            return
        job = wait_or_last(client, job_id, wait_s, attempts)
    echo_waited(job)


@command.command("wait")
@click.argument("job_id")
@connection_options
def wait(job_id: str, url: str | None, api_key: str | None) -> None:
    """Follow the job's events with a progress line on stderr (its queue position and ETA,
    or that no worker serves it yet), then print the finished job; exit 0 if it succeeded, 1
    if it ended otherwise, 3 if an error kept it from learning."""
    last, progress = None, Progress()
    with connect(url, api_key, waits=True) as client, _progress_line() as show:
        # Read first, retried as any call is: a producer that is down (or a wrong URL) failed
        # only once the stream's resumes ran out, two minutes of silence later.
        job = client.get(job_id)
        if not job.done:
            for event in client.stream(job_id):
                if (line := progress.line(event)) not in (None, last):
                    show(line)
                    last = line
            job = wait_or_last(client, job_id, SETTLE_S)
    echo_waited(job)


# How long the job may take to end after its stream's `final` event: an LLM job's worker writes
# that event before it marks the job finished, so a read just after it can find it `running`.
SETTLE_S = 30.0
# Why a job waits with no start time known, as a `scaling` event says: no autoscaler need be
# running (`conveyor up` runs none), so the line claims no worker is coming unless one loads.
NO_WORKER = "no worker serves this model yet (an autoscaler starts one from the queue)"
WARMING = "a worker for this model is loading its engine"


class Progress:
    """What each event says about the job's progress, in a few words (None: nothing new). A
    `scaling` event's news holds while the job waits with no start time known: the `queued`
    event that follows it in the same tick replaced it at once."""

    def __init__(self) -> None:
        self.no_start: str | None = None  # the last `scaling` event's news, while it holds

    def line(self, event: Event) -> str | None:
        if event.event == "queued":
            data = event.json()
            eta = data.get("eta_ms")
            self.no_start = self.no_start if eta is None else None
            if self.no_start:
                return f"queued: {data['queue_position']} ahead; {self.no_start}"
            when = "start time not known yet" if eta is None else f"starts in ~{eta / 1000:.1f}s"
            return f"queued: {data['queue_position']} ahead, {when}"
        if event.event == "scaling":
            self.no_start = WARMING if event.json().get("warming") else NO_WORKER
            return f"queued: {self.no_start}"
        if event.event == "token":
            return "running: streaming tokens"
        if event.event == "restart":
            return "restarted on another worker"
        return None


@contextmanager
def _progress_line() -> Iterator[Any]:
    """A live status line on a terminal; one line per change otherwise (logs, pipes), whole:
    rich wrapped it at 80 columns there, splitting a line in two."""
    from rich.console import Console  # only `jobs wait` draws: not for the others, nor `--help`

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda line: click.echo(line, err=True)
        return
    with console.status("waiting for the job's first event") as status:
        yield status.update


@command.command("cancel")
@click.argument("job_id")
@connection_options
def cancel(job_id: str, url: str | None, api_key: str | None) -> None:
    """Cancel a queued or running job and print it."""
    with connect(url, api_key) as client:
        job = client.cancel(job_id)
    click.echo(job.model_dump_json(indent=2, exclude_none=True))
