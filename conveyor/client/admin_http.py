"""One admin call to the producer for the CLI's traffic commands (`conveyor routes`, `conveyor
canary`): the SDK's address and key resolution, JSON in and out, and an error answer turned
into one readable line instead of a traceback."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from conveyor.client.cli_options import bad_url, printable, stack_target


def admin_call(
    method: str, path: str, url: str | None, api_key: str | None, body: Any = None
) -> Any:
    """The producer's JSON answer; one readable line for every failure: the running stack's
    producer when no URL is given (as every other command finds it), a number that is no JSON
    (`nan`: a traceback before), an answer that is not JSON (a proxy's HTML page: the same), a
    redirect (an ingress sending http to https: `routes set` read its empty body as the routes,
    a TypeError traceback)."""
    import httpx  # here, not above: `routes` and `canary` import this module for their `--help`

    from conveyor.client.connection import http_options
    from conveyor.client.errors import APIError, raise_for_error

    try:
        options = http_options(*stack_target(url, api_key), 30.0)
    except ValueError as exc:
        raise bad_url(exc) from None
    try:
        content = None if body is None else json.dumps(body, allow_nan=False)
    except ValueError as exc:
        raise click.UsageError(f"every number must be finite: {exc}") from None
    try:
        with httpx.Client(**options) as client:
            headers = {"Content-Type": "application/json"}
            response = client.request(method, path, content=content, headers=headers)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the producer: {exc!r}") from None
    except httpx.InvalidURL as exc:  # a model name past httpx's 65536 characters: a traceback
        raise click.UsageError(f"the request's URL cannot be sent: {exc}") from None
    try:
        raise_for_error(response)
    except APIError as exc:  # a redirect too: it was read as an empty answer, None
        raise click.ClickException(printable(str(exc))) from None
    try:
        return response.json() if response.content else None
    except ValueError:
        raise click.ClickException(f"not the producer's answer: {response.text[:200]!r}") from None


def clock(at: float) -> str:
    """A Unix time as the UTC time of day, for the commands' event lines."""
    return time.strftime("%H:%M:%S", time.gmtime(at))


def utc_time(at: float) -> str:
    """`at` (Unix s) as its UTC date and time, for what lasts days (the time of day alone read
    a file kept a day as expiring when it was uploaded)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
