"""Whether a configured address can be sent an HTTP request at all: `http(s)://`, a host and a
usable port. Checked where the address is given (a setting, a CLI option, the SDK's base URL),
so a typo is one clear error there, not a request that fails later, after retries, or never
matches."""

from __future__ import annotations

from urllib.parse import urlsplit


def is_http_url(url: str) -> bool:
    """A port out of range, not a number, or 0 counts as none: urlsplit reads it only when asked
    (an allow-list entry `https://hooks.example.com:99999` was taken, and matched no URL)."""
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # an unclosed IPv6 literal (`http://[::1`), a port out of range
        return False
