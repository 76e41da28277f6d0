"""One admin call to the producer for the CLI's traffic commands (`conveyor routes`, `conveyor
canary`): the SDK's address and key resolution, JSON in and out, and an error answer turned
into one readable line instead of a traceback."""

from __future__ import annotations

import time
from typing import Any

import click
import httpx

from conveyor.client.cli_options import bad_url
from conveyor.client.connection import http_options


def admin_call(
    method: str, path: str, url: str | None, api_key: str | None, body: Any = None
) -> Any:
    try:
        options = http_options(url, api_key, 30.0)
    except ValueError as exc:
        raise bad_url(exc) from None
    try:
        with httpx.Client(**options) as client:
            response = client.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the producer: {exc!r}") from None
    payload = response.json() if response.content else None
    if response.is_error:
        error = (payload or {}).get("error", {}) if isinstance(payload, dict) else {}
        detail = f"{error.get('type', 'error')}: {error.get('message', response.text)}"
        raise click.ClickException(f"{response.status_code} {detail}")
    return payload


def clock(at: float) -> str:
    """A Unix time as the UTC time of day, for the commands' event lines."""
    return time.strftime("%H:%M:%S", time.gmtime(at))
