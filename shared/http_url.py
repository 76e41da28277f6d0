"""Whether a configured address can be sent an HTTP request at all: `http(s)://` and a host.
Checked where the address is given (a setting, a CLI option, the SDK's base URL), so a typo is
one clear error there, not a request that fails later, after retries, or never matches."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # an unclosed IPv6 literal (`http://[::1`)
        return False
