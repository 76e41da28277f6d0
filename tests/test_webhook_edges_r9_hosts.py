"""Webhook hosts no receiver can be reached at: a DNS label over 63 characters or a name over
253 matched a `*.` rule and was accepted at submit (202), then every attempt failed (the name
lookup refuses it) for the whole retry window, where the submit should have said so (422)."""

from __future__ import annotations

import pytest

from shared.webhook_events import allowed

RULES = ["https://*.acme.io"]


@pytest.mark.parametrize(
    "host",
    [
        "a" * 64 + ".acme.io",  # one label past DNS's 63 octets
        ".".join(["a" * 60] * 5) + ".acme.io",  # a name past DNS's 253 octets
    ],
)
def test_a_host_dns_cannot_carry_is_not_allowed(host: str) -> None:
    assert not allowed(f"https://{host}/hooks", RULES)


def test_the_longest_host_dns_carries_is_allowed() -> None:
    host = ".".join(["a" * 63] * 3 + ["a" * 53]) + ".acme.io"
    assert len(host) == 253
    assert allowed(f"https://{host}/hooks", RULES)
