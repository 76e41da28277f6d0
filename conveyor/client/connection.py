"""Where the SDK connects and as whom: arguments first, then `CONVEYOR_URL` (default
`http://127.0.0.1:8000`) and `CONVEYOR_API_KEY`, the same for the SDK and the CLI."""

from __future__ import annotations

import math
import os
from typing import Any

from conveyor.client.errors import InvalidArgument
from shared.http_url import is_http_url

DEFAULT_URL = "http://127.0.0.1:8000"
USER_AGENT = "conveyor-client/0.1"


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """A URL that is not http(s) with a host is refused here: sent, it failed only after every
    retry's backoff, as if the producer were down. So is one with a query or fragment, which
    no call's path joins onto (each went to the URL's own path, its path in the query)."""
    url = base_url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL
    if not is_http_url(url):
        raise ValueError(f"producer URL {url!r} is not an http(s) URL with a host")
    if "?" in url or "#" in url:
        raise ValueError(f"producer URL {url!r} has a query or fragment; give its path only")
    return url.rstrip("/"), _key(api_key or os.environ.get("CONVEYOR_API_KEY") or "") or None


class InvalidApiKey(InvalidArgument):
    """An API key no `Authorization` header can carry (the CLI names `--api-key` for it)."""


def _key(key: str) -> str:
    """The key without the whitespace around it (a key file's or Secret's trailing newline:
    each try failed before it was sent, was retried as an outage, and its error printed the
    key). One holding other characters no header carries is refused here, the key unshown: a
    non-ASCII one was httpx's UnicodeEncodeError, a control character retried as an outage."""
    key = key.strip()
    if not (key.isascii() and key.isprintable()):
        raise InvalidApiKey(
            "the API key holds characters no HTTP header carries (non-ASCII, or control characters)"
        )
    return key


def http_options(base_url: str | None, api_key: str | None, timeout: float) -> dict[str, Any]:
    """Keyword arguments for `httpx.Client` / `httpx.AsyncClient`. A timeout no request can be
    sent with is refused here: 0 failed every call as an outage after every retry's backoff, a
    negative, NaN or infinite one raised the socket's ValueError or OverflowError at the first."""
    if not 0 < timeout < math.inf:
        raise InvalidArgument(f"timeout {timeout!r}: seconds, more than 0 and finite")
    url, key = resolve(base_url, api_key)
    headers = {"User-Agent": USER_AGENT}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return {"base_url": url, "headers": headers, "timeout": timeout}
