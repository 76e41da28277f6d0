"""What every SDK-backed command shares: `--url` / `--api-key` (else `CONVEYOR_URL` /
`CONVEYOR_API_KEY`, as the SDK reads them), and a client whose failures end the command with
one readable line instead of a traceback."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

# The SDK (httpx, pydantic) and the settings are imported in the functions that use them: every
# SDK-backed command imports this module for its options, and its `--help` needs neither.
if TYPE_CHECKING:
    import httpx

    from conveyor.client.errors import ConveyorError
    from conveyor.client.retries import RetryEvent
    from conveyor.client.sync_client import Client
    from conveyor.client.types import Job

F = TypeVar("F", bound=Callable[..., Any])


def connection_options(command: F) -> F:
    command = click.option(
        "--url",
        envvar="CONVEYOR_URL",
        help="Producer URL [env CONVEYOR_URL; http://127.0.0.1:8000]",
    )(command)
    return click.option(
        "--api-key", envvar="CONVEYOR_API_KEY", help="API key [env CONVEYOR_API_KEY]"
    )(command)


def _say_retry(event: RetryEvent) -> None:
    click.echo(f"{event.reason}; retry {event.attempt} in {event.delay_s:.1f}s", err=True)


def bad_url(exc: ValueError) -> click.BadParameter:
    """The URL (or CONVEYOR_URL) cannot be a producer's, or the API key (or CONVEYOR_API_KEY)
    cannot be sent: a usage error naming its option, not an outage (a bad key was blamed on
    `--url`)."""
    from conveyor.client.connection import InvalidApiKey

    option = "'--api-key'" if isinstance(exc, InvalidApiKey) else "'--url'"
    return click.BadParameter(str(exc), param_hint=option)


def stack_target(url: str | None, api_key: str | None) -> tuple[str | None, str | None]:
    """`url` and `api_key`; without a URL, the running `conveyor up`'s producer (with its
    development key unless a key is given), else the SDK's default (None)."""
    from conveyor.local_stack import StackState
    from shared.settings import get_settings

    local = StackState.read(get_settings().state_dir) if url is None else None
    if local is not None:
        return local.producer_url, api_key or local.dev_key
    return url, api_key


# What a command that waited exits with, for scripts: the job (or batch) ended otherwise than
# succeeded (completed, for a batch); it had not ended when the wait ran out (as timeout(1)); or
# an error (the producer unreachable, a request refused) kept it from learning how the job
# ended: 1 said the job had failed, and a script took a job still running for a failed one.
NOT_SUCCEEDED = 1
OUTCOME_UNKNOWN = 3
WAIT_TIMED_OUT = 124


class OutcomeUnknown(click.ClickException):
    """The error of a command that waits: it exits OUTCOME_UNKNOWN, not 1 (`NOT_SUCCEEDED`)."""

    exit_code = OUTCOME_UNKNOWN


@contextmanager
def connect(url: str | None, api_key: str | None, waits: bool = False) -> Iterator[Client]:
    """A client of `url` (`stack_target`). `waits`: the command reports how a job ended, so
    an error exits OUTCOME_UNKNOWN."""
    import httpx

    from conveyor.client.errors import ConveyorError, InvalidArgument
    from conveyor.client.sync_client import Client

    url, api_key = stack_target(url, api_key)
    try:
        client = Client(url, api_key, on_retry=_say_retry)
    except ValueError as exc:
        raise bad_url(exc) from None
    failure = OutcomeUnknown if waits else click.ClickException
    try:
        with client:
            yield client
    except InvalidArgument as exc:
        raise click.UsageError(printable(str(exc))) from None
    except (ConveyorError, httpx.HTTPError) as exc:
        raise failure(_failed(exc)) from None


def _failed(exc: ConveyorError | httpx.HTTPError) -> str:
    """A call's failure as the CLI says it: the producer's refusal, or why it was not reached."""
    from conveyor.client.errors import ConveyorError

    if isinstance(exc, ConveyorError):
        return printable(str(exc))
    return f"cannot reach the producer: {exc!r}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` from the producer (a filename, a refusal echoing an id) with its control
    characters written as `\\xNN`: sent raw to a terminal, an escape sequence in it could clear
    the screen, retitle the window or forge lines."""
    return _CONTROL.sub(lambda control: f"\\x{ord(control[0]):02x}", text)


def terminal_safe(text: str) -> bool:
    """Whether `text` holds no control character but a tab or a line end: one a terminal
    would act on rather than show."""
    return all(control in "\t\n\r" for control in _CONTROL.findall(text))


@contextmanager
def runs_on(note: str) -> Iterator[None]:
    """A wait after a create, which its failure or Ctrl-C leaves running: the error says
    `note` (its id, and the command that follows it up), which nothing had printed, so a
    script told "outcome unknown" (3) could not learn it."""
    import httpx

    from conveyor.client.errors import ConveyorError

    try:
        yield
    except (ConveyorError, httpx.HTTPError) as exc:
        raise OutcomeUnknown(f"{_failed(exc)}; {note}") from None
    except KeyboardInterrupt:
        click.echo(note, err=True)
        raise


class _NotFinite(ValueError):
    """A number JSON cannot carry: Python's json reads `NaN`, `Infinity` and `1e400` (as inf),
    and sending them failed with httpx's traceback."""


def _refuse(number: str) -> float:
    raise _NotFinite(number)


def _finite(number: str) -> float:
    value = float(number)
    return value if math.isfinite(value) else _refuse(number)


def json_argument(text: str, option: str) -> Any:
    """A JSON value given inline, or `@path` to read it from a file, `@-` from standard input
    as curl's `-d @-` (`option`: where it was given, for the error)."""
    if text.startswith("@"):
        path = text[1:]
        try:
            with click.open_file(path, encoding="utf-8") as source:  # `-`: standard input
                text = source.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from None
    try:
        return json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except _NotFinite as exc:
        message = f"JSON number {exc} is not a finite number"
        raise click.BadParameter(message, param_hint=option) from None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    except RecursionError:  # json's decoder recurses per level: Python's limit, some 1000
        raise click.BadParameter("JSON nested too deeply to read", param_hint=option) from None


def echo_waited(job: Job) -> None:
    """Print a job the command waited for, then exit 0 only if it succeeded."""
    click.echo(job.model_dump_json(indent=2, exclude_none=True))
    if not job.done:
        raise click.exceptions.Exit(WAIT_TIMED_OUT)
    if not job.succeeded:
        raise click.exceptions.Exit(NOT_SUCCEEDED)


def wait_or_last(client: Client, job_id: str, timeout: float, attempts: bool = False) -> Job:
    """The job once it ends, or as it stands when `timeout` runs out (`attempts`: with its
    attempt history)."""
    from conveyor.client.errors import WaitTimeout

    try:
        return client.wait(job_id, timeout, attempts)
    except WaitTimeout as late:
        job: Job = late.last
        return job
