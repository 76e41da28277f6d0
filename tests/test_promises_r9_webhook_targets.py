"""README's SSRF promise for webhooks held to its letter: a receiver's name that resolves to a
non-global address is refused, IPv6's deprecated site-local `fec0::/10` (RFC 3879, the private
range before `fc00::/7`) too, which Python's `is_global` calls global. On real local sockets."""

from __future__ import annotations

import pytest

from tests.test_webhook_edges_targets import EVENT, _resolving
from tests.webhook_receiver import Receiver
from workers.webhook_delivery import _post


@pytest.mark.parametrize("address", ["fec0::1", "feed:beef::a9fe:a9fe"])
def test_a_name_resolving_to_a_site_local_address_is_not_connected_to(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    """A site that still numbers its network from `fec0::/10` is as private as one on
    `fc00::/7`; the attempt went on to connect there, as to a public receiver."""
    _resolving(monkeypatch, "hooks.tenant.example", address)
    outcome = _post(f"http://hooks.tenant.example:{receiver.server_address[1]}/", b"{}", EVENT)
    assert outcome["error"].startswith("PrivateAddress: hooks.tenant.example resolves to"), outcome
