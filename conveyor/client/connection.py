"""Where the SDK connects and as whom: arguments first, then `CONVEYOR_URL` (default
`http://127.0.0.1:8000`) and `CONVEYOR_API_KEY`, the same for the SDK and the CLI."""

from __future__ import annotations

import os
from typing import Any

from shared.http_url import is_http_url

DEFAULT_URL = "http://127.0.0.1:8000"
USER_AGENT = "conveyor-client/0.1"


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """A URL that is not http(s) with a host is refused here: sent, it failed only after every
    retry's backoff, as if the producer were down."""
    url = base_url or os.environ.get("CONVEYOR_URL") or DEFAULT_URL
    if not is_http_url(url):
        raise ValueError(f"producer URL {url!r} is not an http(s) URL with a host")
    return url.rstrip("/"), api_key or os.environ.get("CONVEYOR_API_KEY") or None


def http_options(base_url: str | None, api_key: str | None, timeout: float) -> dict[str, Any]:
    """Keyword arguments for `httpx.Client` / `httpx.AsyncClient`."""
    url, key = resolve(base_url, api_key)
    headers = {"User-Agent": USER_AGENT}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return {"base_url": url, "headers": headers, "timeout": timeout}
