"""A receiver whose first address drops connection attempts (a dead node of a DNS round robin
that sends no reset, an AAAA behind a firewall): the delivery waited on it for the whole
timeout, never reached the next address, and failed every attempt for the whole retry window,
where the HTTP client's own connect moves on to the next address within a quarter second."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.test_webhook_edges_targets import _resolving
from tests.webhook_receiver import Receiver, serving
from workers.webhook_delivery import _post

EVENT = {"id": "evt_blackholed", "type": "job.succeeded"}


@pytest.fixture
def receiver(settings_env: Callable[..., None]) -> Iterator[Receiver]:
    settings_env(
        CONVEYOR_WEBHOOK_TIMEOUT_S="1",
        CONVEYOR_WEBHOOK_SECRET="whsec-test",
        CONVEYOR_WEBHOOK_INTERNAL_HOSTS="hooks.internal",
    )
    with serving() as server:
        yield server


@pytest.fixture
def dropping(receiver: Receiver) -> Iterator[str]:
    """127.0.0.2 on the receiver's port, dropping new connection attempts: its one-place
    accept queue is full, and the kernel drops a SYN it has no place for (no reset)."""
    listener = socket.create_server(("127.0.0.2", receiver.server_address[1]), backlog=0)
    queued = socket.create_connection(("127.0.0.2", receiver.server_address[1]))
    with listener, queued:
        yield "127.0.0.2"


def test_a_receiver_whose_first_address_drops_connects_is_delivered_at_the_next(
    receiver: Receiver, dropping: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _resolving(monkeypatch, "hooks.internal", dropping, "127.0.0.1")
    outcome = _post(f"http://hooks.internal:{receiver.server_address[1]}/hooks", b"{}", EVENT)
    assert outcome["status_code"] == 200, outcome
    assert [d["path"] for d in receiver.deliveries] == ["/hooks"]
