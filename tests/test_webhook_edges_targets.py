"""Edges of where a webhook may connect, on real local sockets: a name resolving to an IPv6
address a translator turns into a private IPv4 one, a receiver with several
addresses of which the first is down, and allow-list entries naming a port no URL can use."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from shared.http_url import is_http_url
from shared.settings import Settings
from tests.webhook_receiver import Receiver
from workers.webhook_delivery import _post

EVENT = {"id": "evt_1", "type": "job.succeeded"}


def _resolving(monkeypatch: pytest.MonkeyPatch, name: str, *addresses: str) -> None:
    """The system resolver, answering `name` with every one of `addresses`, in that order."""
    lookup = socket.getaddrinfo

    def resolve(host: bytes | str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in (name, name.encode()):
            return lookup(host, port, *args, **kwargs)
        return [info for address in addresses for info in lookup(address, port, *args, **kwargs)]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


@pytest.mark.parametrize("address", ["64:ff9b:1::a9fe:a9fe", "::ffff:0:a9fe:a9fe"])
def test_a_name_resolving_to_a_translators_local_address_is_not_connected_to(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    """64:ff9b:1::/48 (RFC 8215, NAT64 for a site's own translator, never globally reachable)
    and SIIT's IPv4-translated ::ffff:0:0:0/96 were taken for public, even carrying the
    metadata service's address."""
    _resolving(monkeypatch, "hooks.tenant.example", address)
    outcome = _post(f"http://hooks.tenant.example:{receiver.server_address[1]}/", b"{}", EVENT)
    assert outcome["error"].startswith("PrivateAddress: hooks.tenant.example resolves to"), outcome


def test_a_receiver_whose_first_address_is_down_is_delivered_at_the_next(
    receiver: Receiver, settings_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name with several addresses (DNS round robin, one node down, or an AAAA the worker has
    no route to): only the first was tried, so every attempt failed for the whole retry window
    while the others answered."""
    settings_env(CONVEYOR_WEBHOOK_INTERNAL_HOSTS="hooks.internal")
    _resolving(monkeypatch, "hooks.internal", "127.0.0.2", "127.0.0.1")
    port = receiver.server_address[1]
    outcome = _post(f"http://hooks.internal:{port}/hooks", b"{}", EVENT)
    assert outcome["status_code"] == 200, outcome
    (delivery,) = receiver.deliveries
    assert delivery["headers"]["Host"] == f"hooks.internal:{port}"


@pytest.mark.parametrize(
    "entry",
    ["https://hooks.example.com:99999/", "https://hooks.example.com:https/", "http://hooks:0/"],
)
def test_an_allowlist_entry_with_a_port_no_url_can_use_stops_the_start(entry: str) -> None:
    """Such an entry matched no URL: every webhook was refused at submit as outside the list,
    with nothing saying the list itself was wrong."""
    assert not is_http_url(entry)
    with pytest.raises(ValidationError, match="is not http"):
        Settings(webhook_allowlist=entry)
