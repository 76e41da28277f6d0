"""Where a webhook may connect, on real local sockets: a receiver's DNS name is the tenant's to
point anywhere (its own domain under an allow-list entry, a `*.` rule), so a name that resolves
to a loopback, private, link-local or IPv4-mapped address is refused, and the attempt connects
to the very address it checked (a name that rebinds after the check reaches nothing else). An
address written in the URL itself is the operator's: the allow-list names it literally."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.webhook_receiver import Receiver
from workers import webhook_delivery
from workers.webhook_delivery import _post

EVENT = {"id": "evt_1", "type": "job.succeeded"}


def _resolving(monkeypatch: pytest.MonkeyPatch, name: str, *answers: str) -> list[str]:
    """The system resolver, answering `name` with `answers[i]` at its i-th lookup (the last one
    after that); the lookups of `name` made, returned."""
    lookup = socket.getaddrinfo
    made: list[str] = []

    def resolve(host: bytes | str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in (name, name.encode()):
            return lookup(host, port, *args, **kwargs)
        address = answers[min(len(made), len(answers) - 1)]
        made.append(address)
        return lookup(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    return made


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "169.254.169.254"]
)
def test_a_name_resolving_to_a_local_address_is_not_connected_to(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    _resolving(monkeypatch, "hooks.tenant.example", address)
    port = receiver.server_address[1]
    outcome = _post(f"http://hooks.tenant.example:{port}/hooks", b"{}", EVENT)
    assert outcome["error"].startswith("PrivateAddress: hooks.tenant.example resolves to"), outcome
    assert receiver.deliveries == []


def test_localhost_is_not_connected_to(receiver: Receiver) -> None:
    outcome = _post(f"http://localhost:{receiver.server_address[1]}/hooks", b"{}", EVENT)
    assert outcome["error"].startswith("PrivateAddress: localhost resolves to"), outcome
    assert receiver.deliveries == []


def test_a_host_the_operator_names_internal_may_resolve_to_a_private_address(
    receiver: Receiver, settings_env: Callable[..., None]
) -> None:
    """An in-cluster receiver (a Service's name) is the operator's, named exactly in
    CONVEYOR_WEBHOOK_INTERNAL_HOSTS: delivered, at the address checked, with its own Host."""
    settings_env(CONVEYOR_WEBHOOK_INTERNAL_HOSTS="LocalHost, hooks.internal")
    port = receiver.server_address[1]
    outcome = _post(f"http://localhost:{port}/hooks", b"{}", EVENT)
    assert outcome["status_code"] == 200, outcome
    (delivery,) = receiver.deliveries
    assert delivery["headers"]["Host"] == f"localhost:{port}"


def test_a_name_that_rebinds_after_its_check_is_not_looked_up_again(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first answer passes the check (taken for public here: no test reaches the network),
    the name then rebinds to the receiver's address: the attempt goes to the first, where
    nothing listens, and is refused."""
    monkeypatch.setattr(webhook_delivery, "_public", lambda _: True)
    made = _resolving(monkeypatch, "rebind.tenant.example", "127.0.0.2", "127.0.0.1")
    port = receiver.server_address[1]
    outcome = _post(f"http://rebind.tenant.example:{port}/hooks", b"{}", EVENT)
    assert made == ["127.0.0.2"] and outcome["error"].startswith("ConnectError"), outcome
    assert receiver.deliveries == []


def test_an_address_the_url_names_is_connected_to_with_its_host(receiver: Receiver) -> None:
    outcome = _post(f"{receiver.base}/hooks", b"{}", EVENT)
    assert outcome["status_code"] == 200, outcome
    (delivery,) = receiver.deliveries
    assert delivery["headers"]["Host"] == receiver.base.removeprefix("http://")


def test_a_name_that_does_not_resolve_is_a_network_error(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup's own error (no HTTPError) is the attempt's, retried: raised, it ended the
    task with no attempt on record."""

    def unknown(*_: Any, **__: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    outcome = _post("http://nothing.tenant.example/hooks", b"{}", EVENT)
    assert outcome["error"].startswith("ConnectError"), outcome
