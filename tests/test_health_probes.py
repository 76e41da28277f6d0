"""The probes answer HEAD as they answer GET, on a real producer: a load balancer or monitor
that checks with HEAD (HAProxy's `option httpchk HEAD /readyz`, many uptime checkers; RFC 9110
has every general-purpose server support it) got 405 and took a healthy producer for down."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_probe_answers_head_as_it_answers_get(base_url: str, path: str) -> None:
    got = httpx.get(f"{base_url}{path}", timeout=10)
    head = httpx.head(f"{base_url}{path}", timeout=10)
    assert (head.status_code, head.content) == (got.status_code, b""), head.headers
